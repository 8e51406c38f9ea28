"""Initial weights of each family against Hugging Face's own initialisation (no download).

GPT-2 scales the projections that write into the residual stream by 1/√(2 · n_layers); BERT and
LLaMA do not. The standard deviations are measured on freshly built models of both libraries, so a
preset that drifts from its paper's scheme fails here.
"""

import pytest
import torch

from companion.config import ModelConfig
from companion.models.bert import BERT
from companion.models.gpt import GPT

transformers = pytest.importorskip("transformers")

D, LAYERS, HEADS, FF, VOCAB = 256, 8, 4, 1024, 64


def _std(weight: torch.Tensor) -> float:
    return weight.detach().float().std().item()


def _hf(kind: str):
    torch.manual_seed(0)
    if kind == "gpt2":
        c = transformers.GPT2Config(vocab_size=VOCAB, n_embd=D, n_layer=LAYERS, n_head=HEADS, n_positions=32)
        m = transformers.GPT2LMHeadModel(c)
        return {"attention out": m.transformer.h[0].attn.c_proj.weight, "ffn out": m.transformer.h[0].mlp.c_proj.weight,
                "ffn in": m.transformer.h[0].mlp.c_fc.weight}
    if kind == "bert":
        c = transformers.BertConfig(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=LAYERS,
                                    num_attention_heads=HEADS, intermediate_size=FF, max_position_embeddings=32)
        m = transformers.BertForPreTraining(c)
        layer = m.bert.encoder.layer[0]
        return {"attention out": layer.attention.output.dense.weight, "ffn out": layer.output.dense.weight,
                "ffn in": layer.intermediate.dense.weight}
    c = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                 num_key_value_heads=HEADS, intermediate_size=FF, max_position_embeddings=32)
    m = transformers.LlamaForCausalLM(c)
    layer = m.model.layers[0]
    return {"attention out": layer.self_attn.o_proj.weight, "ffn out": layer.mlp.down_proj.weight,
            "ffn in": layer.mlp.up_proj.weight}


def _ours(kind: str):
    torch.manual_seed(0)
    sizes = dict(vocab_size=VOCAB, d_model=D, n_layers=LAYERS, n_heads=HEADS, max_len=32)
    if kind == "gpt2":
        block = GPT(ModelConfig.preset("tiny", **sizes)).layers[0]
        return {"attention out": block.self_attn.out_proj.weight, "ffn out": block.ffn.w2.weight,
                "ffn in": block.ffn.w1.weight}
    if kind == "bert":
        block = BERT(ModelConfig.preset("bert-tiny", d_ff=FF, **sizes)).layers[0]
        return {"attention out": block.self_attn.out_proj.weight, "ffn out": block.ffn.w2.weight,
                "ffn in": block.ffn.w1.weight}
    block = GPT(ModelConfig.preset("llama-tiny", n_kv_heads=HEADS, d_ff=FF, **sizes)).layers[0]
    return {"attention out": block.self_attn.out_proj.weight, "ffn out": block.ffn.w_out.weight,
            "ffn in": block.ffn.w_in.weight}


@pytest.mark.parametrize("kind", ["gpt2", "bert", "llama"])
def test_each_family_starts_with_its_papers_standard_deviations(kind):
    ours, theirs = _ours(kind), _hf(kind)
    for name in ("attention out", "ffn out", "ffn in"):
        assert _std(ours[name]) == pytest.approx(_std(theirs[name]), rel=0.03), (kind, name)
    scaled = _std(ours["ffn out"]) / _std(ours["ffn in"])
    expected = (2 * LAYERS) ** -0.5 if kind == "gpt2" else 1.0  # only GPT-2 scales the residual projections
    assert scaled == pytest.approx(expected, rel=0.03)


def test_bert_has_no_dropout_inside_its_ffn_and_t5_keeps_it():
    bert = ModelConfig.preset("bert-base")
    assert bert.dropout == 0.1 and bert.resolved_ffn_dropout == 0.0
    block = BERT(ModelConfig.preset("bert-tiny", dropout=0.1, ffn_dropout=0.0)).layers[0]
    ffn = block.ffn.train()
    x = torch.randn(2, 5, 64)
    assert torch.equal(ffn(x), ffn(x))  # training mode, yet deterministic: nothing dropped inside
    t5 = ModelConfig.preset("t5-small")
    assert t5.resolved_ffn_dropout == t5.dropout == 0.1  # HF T5DenseActDense drops its hidden units
    noisy = BERT(ModelConfig.preset("bert-tiny", dropout=0.1, ffn_dropout=0.5)).layers[0].ffn.train()
    assert not torch.equal(noisy(x), noisy(x))


@pytest.mark.parametrize("changes, match", [
    ({"ffn_dropout": 1.0}, r"ffn_dropout must be a float in \[0, 1\)"),
    ({"ffn_dropout": True}, r"ffn_dropout must be a float in \[0, 1\)"),
    ({"residual_init_scale": "yes"}, "residual_init_scale must be a bool"),
])
def test_bad_init_and_dropout_fields_are_named(changes, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(vocab_size=10, d_model=16, n_heads=4, **changes)
