"""Tests for companion.models.t5: equal to HF T5 (logits and decoding), the published size, sharing."""

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from companion.config import ModelConfig
from companion.generation import beam_search, greedy_decode
from companion.models.t5 import T5
from companion.utils import count_parameters
from tests.hf_parity import randomize_


def _hf(**kw):
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=60, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, **kw)
    return randomize_(transformers.T5ForConditionalGeneration(config).eval())


def _batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(2, 60, (3, 9), generator=g)
    mask = torch.ones_like(src)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    tgt = torch.randint(2, 60, (3, 5), generator=g)
    tgt[:, 0] = 0  # T5 starts decoding from the padding id
    return src * mask, mask, tgt


@pytest.mark.parametrize("kw", [{}, {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
                                {"num_decoder_layers": 3}])
def test_from_hf_gives_equal_logits_with_source_padding(kw):
    hf = _hf(**kw)
    ours = T5.from_hf(hf)
    src, mask, tgt = _batch()
    with torch.no_grad():
        expected = hf(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        got = ours(src, tgt, attention_mask=mask)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_greedy_and_beam_decoding_match_hf_generate():
    hf = _hf()
    ours = T5.from_hf(hf)
    src, mask, _ = _batch()
    with torch.no_grad():
        greedy = hf.generate(src, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        beam = hf.generate(src, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False, num_beams=3,
                           length_penalty=0.0, early_stopping=True)
    assert torch.equal(greedy_decode(ours, src, 0, 1, max_len=8), greedy)
    assert torch.equal(beam_search(ours, src, 0, 1, beam_size=3, max_len=8, alpha=0.0, early_stopping=True), beam)


def test_t5_small_has_the_published_size_and_shares_one_bias_table_per_stack():
    model = T5(ModelConfig.preset("t5-small"))
    assert count_parameters(model) == 60_506_624  # HF T5ForConditionalGeneration('t5-small')
    assert model.src_embed is model.tgt_embed and model.out_proj is None
    tables = [n for n, _ in model.named_parameters() if "relative_attention_bias" in n]
    assert tables == ["encoder.positions.t5.relative_attention_bias.weight",
                      "decoder.positions.t5.relative_attention_bias.weight"]
    assert model.encoder.positions.t5.bidirectional and not model.decoder.positions.t5.bidirectional
    assert not any(n.endswith(".bias") and "relative" not in n for n, _ in model.named_parameters())


def test_tied_output_is_rescaled():
    torch.manual_seed(0)
    model = T5(ModelConfig.preset("t5-tiny", vocab_size=40)).eval()
    h = torch.randn(1, 2, 64)
    torch.testing.assert_close(model.project(h), (h * 64**-0.5) @ model.src_embed.weight.T)
    with pytest.raises(ValueError, match="T5 shares one vocabulary"):
        T5(ModelConfig.preset("t5-tiny", vocab_size=40, tgt_vocab_size=30))
    with pytest.raises(TypeError, match="T5ForConditionalGeneration"):
        T5.from_hf(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("ffn", ["relu", "geglu"])
def test_initialisation_matches_hf_t5_scales(ffn):
    # T5's scheme (HF T5PreTrainedModel._init_weights, factor 1): N(0, 1/fan_in) everywhere,
    # the query a further 1/sqrt(head_dim) smaller because the scores are not scaled.
    transformers = pytest.importorskip("transformers")
    config = ModelConfig.preset("t5-tiny", vocab_size=300, d_model=128, d_ff=512, ffn=ffn)
    torch.manual_seed(0)
    ours = T5(config)
    hf_config = transformers.T5Config(vocab_size=300, d_model=128, d_kv=config.resolved_head_dim, d_ff=512,
                                      num_layers=2, num_heads=4, feed_forward_proj="relu" if ffn == "relu" else
                                      "gated-gelu", dropout_rate=0.0)
    hf = transformers.T5ForConditionalGeneration(hf_config)
    hf_block = hf.encoder.block[0].layer
    attn, hf_attn = ours.encoder.layers[0].self_attn, hf_block[0].SelfAttention
    q_rows = config.n_heads * config.resolved_head_dim
    pairs = [(attn.in_proj.weight[:q_rows], hf_attn.q.weight), (attn.in_proj.weight[q_rows:], hf_attn.k.weight),
             (attn.out_proj.weight, hf_attn.o.weight), (ours.src_embed.weight, hf.shared.weight)]
    ffn_ours, ffn_hf = ours.encoder.layers[0].ffn, hf_block[1].DenseReluDense
    if ffn == "relu":
        pairs += [(ffn_ours.w1.weight, ffn_hf.wi.weight), (ffn_ours.w2.weight, ffn_hf.wo.weight)]
    else:
        pairs += [(ffn_ours.w_gate.weight, ffn_hf.wi_0.weight), (ffn_ours.w_out.weight, ffn_hf.wo.weight)]
    untied = T5(config.replace(tie_embeddings=False))
    hf_untied = transformers.T5ForConditionalGeneration(hf_config.__class__(**{**hf_config.to_dict(),
                                                                               "tie_word_embeddings": False}))
    pairs.append((untied.out_proj.weight, hf_untied.lm_head.weight))  # T5 v1.1's own output layer: N(0, 1)
    for mine, theirs in pairs:
        assert mine.std().item() == pytest.approx(theirs.std().item(), rel=0.1)
    assert attn.in_proj.weight[:q_rows].std() < 0.25 * attn.in_proj.weight[q_rows:].std()  # 1/sqrt(32) smaller


def test_fresh_t5_starts_where_hf_t5_starts():
    # With the 1/sqrt(head_dim) folded into the initial queries, an untrained model's loss on random
    # targets is HF T5's (~5.5 nats for V = 108, ln V = 4.68); PyTorch's default initialisation with
    # unscaled scores starts near 7.
    transformers = pytest.importorskip("transformers")
    g = torch.Generator().manual_seed(0)
    src, tgt_in, labels = (torch.randint(3, 108, shape, generator=g) for shape in ((8, 40), (8, 20), (8, 20)))
    config = ModelConfig.preset("t5-tiny", vocab_size=108, dropout=0.0)
    hf_config = transformers.T5Config(vocab_size=108, d_model=64, d_kv=config.resolved_head_dim, d_ff=256,
                                      num_layers=2, num_heads=4, dropout_rate=0.0)
    ours, theirs = [], []
    for seed in range(3):
        torch.manual_seed(seed)
        ours.append(F.cross_entropy(T5(config)(src, tgt_in).flatten(0, 1), labels.flatten()).item())
        torch.manual_seed(seed)
        hf = transformers.T5ForConditionalGeneration(hf_config)
        logits = hf(input_ids=src, decoder_input_ids=tgt_in).logits
        theirs.append(F.cross_entropy(logits.flatten(0, 1), labels.flatten()).item())
    assert abs(sum(ours) / 3 - sum(theirs) / 3) < 0.3, (ours, theirs)
    assert max(ours) < math.log(108) + 1.5
