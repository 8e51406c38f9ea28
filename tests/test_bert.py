"""Tests for companion.models.bert: equal to HF BERT, the published size, DistilBERT's student."""

import logging

import pytest
import torch

from companion.config import ModelConfig
from companion.models.bert import BERT, SequenceClassifier, distil_student
from companion.utils import count_parameters
from tests.hf_parity import randomize_


def _hf(cls_name="BertForPreTraining"):
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40)
    return randomize_(getattr(transformers, cls_name)(config).eval())


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 50, (3, 9), generator=g)
    segments = torch.zeros_like(ids)
    segments[:, 5:] = 1  # two segments
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 4:] = 0  # a padded batch
    return ids, segments, mask


def test_from_hf_pretraining_gives_equal_outputs():
    hf = _hf()
    ours = BERT.from_hf(hf)
    ids, segments, mask = _batch()
    with torch.no_grad():
        expected = hf(ids, token_type_ids=segments, attention_mask=mask, output_hidden_states=True)
        got = ours(ids, segments, mask)
    real = mask.bool()
    torch.testing.assert_close(got.hidden[real], expected.hidden_states[-1][real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.mlm_logits[real], expected.prediction_logits[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.nsp_logits, expected.seq_relationship_logits, atol=1e-4, rtol=1e-4)


def test_from_hf_bare_model_gives_equal_hidden_and_pooled():
    hf = _hf("BertModel")
    ours = BERT.from_hf(hf)
    ids, segments, mask = _batch()
    with torch.no_grad():
        expected = hf(ids, token_type_ids=segments, attention_mask=mask)
        got = ours(ids, segments, mask)
    torch.testing.assert_close(got.pooled, expected.pooler_output, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.hidden[mask.bool()], expected.last_hidden_state[mask.bool()], atol=1e-4, rtol=1e-4)
    with pytest.raises(TypeError, match="BertModel or BertForPreTraining"):
        BERT.from_hf(torch.nn.Linear(2, 2))


def test_parity_would_see_a_swapped_pair_of_layer_norms():
    # the parity tests' power: with random weights, exchanging two norms changes the outputs
    hf = _hf()
    ours = BERT.from_hf(hf)
    block = ours.layers[0]
    ids, segments, mask = _batch()
    with torch.no_grad():
        before = ours(ids, segments, mask).hidden
        first, second = block.self_norm.weight, block.ffn_norm.weight
        first.data, second.data = second.data.clone(), first.data.clone()
        after = ours(ids, segments, mask).hidden
    assert (after - before).abs().max() > 1e-2


def test_from_hf_refuses_an_untied_mlm_decoder():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40, tie_word_embeddings=False)
    untied = randomize_(transformers.BertForPreTraining(config).eval())
    with pytest.raises(ValueError, match="MLM decoder cls.predictions.decoder.weight is not tied"):
        BERT.from_hf(untied)


def test_bert_base_has_the_published_size():
    model = BERT(ModelConfig.preset("bert-base"))
    heads = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("mlm_", "nsp_")))
    assert count_parameters(model) - heads == 109_482_240  # HF BertModel: embeddings, 12 layers, pooler
    assert model.mlm_logits(torch.zeros(1, 768)).shape == (1, 30522)


def test_bidirectional_and_padding_invariant():
    torch.manual_seed(0)
    model = BERT(ModelConfig.preset("bert-tiny", vocab_size=30)).eval()
    ids = torch.randint(4, 30, (1, 8))
    changed = ids.clone()
    changed[0, 6] = 5 if ids[0, 6] != 5 else 6
    assert not torch.allclose(model(ids).hidden[0, :3], model(changed).hidden[0, :3])  # earlier tokens see later ones
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.tensor([[1] * 8 + [0] * 3])
    got = model(padded, attention_mask=mask).hidden[:, :8]
    torch.testing.assert_close(got, model(ids).hidden, atol=1e-5, rtol=1e-5)


def test_distil_student_takes_every_other_layer():
    torch.manual_seed(0)
    teacher = BERT(ModelConfig.preset("bert-tiny", vocab_size=30, n_layers=4))
    student = distil_student(teacher)
    assert len(student.layers) == 2 and count_parameters(student) < count_parameters(teacher)
    for new, old in ((0, 0), (1, 2)):
        for (name, a), b in zip(student.layers[new].named_parameters(), teacher.layers[old].parameters()):
            assert torch.equal(a, b), name
    torch.testing.assert_close(student.tok_emb.weight, teacher.tok_emb.weight)
    with torch.no_grad():
        student.tok_emb.weight.add_(1.0)
    assert not torch.equal(student.tok_emb.weight, teacher.tok_emb.weight)  # a copy, not a view


def test_classifier_and_bad_inputs():
    model = BERT(ModelConfig.preset("bert-tiny", vocab_size=30))
    clf = SequenceClassifier(model, 3)
    assert clf(torch.randint(4, 30, (2, 6))).shape == (2, 3)
    with pytest.raises(ValueError, match="n_classes must be an int >= 2"):
        SequenceClassifier(model, 1)
    with pytest.raises(ValueError, match=r"token_type_ids must lie in \[0, 2\)"):
        model(torch.ones(1, 3, dtype=torch.long), token_type_ids=torch.full((1, 3), 2))
    with pytest.raises(ValueError, match="attention_mask must have the shape of ids"):
        model(torch.ones(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match="keep_every must be an int >= 1"):
        distil_student(model, 0)
