"""Tests for companion.models.causal_lm: shapes, causality, length limits, parameters, learning."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from companion.attention import causal_mask
from companion.models.causal_lm import POSITIONS, CausalLM
from companion.positional import alibi_bias
from companion.utils import count_parameters

VOCAB = 11


def _model(position: str, **kw) -> CausalLM:
    torch.manual_seed(0)
    kw = {"d_model": 16, "n_layers": 2, "n_heads": 2, "max_len": 8, **kw}
    return CausalLM(VOCAB, position=position, **kw).eval()


@pytest.mark.parametrize("position", POSITIONS)
def test_logits_shape_and_causality(position):
    model = _model(position)
    ids = torch.randint(0, VOCAB, (3, 8))
    logits = model(ids)
    assert logits.shape == (3, 8, VOCAB)
    changed = ids.clone()
    changed[:, 5] = (changed[:, 5] + 1) % VOCAB
    new = model(changed)
    torch.testing.assert_close(new[:, :5], logits[:, :5])  # the past never sees the future
    assert not torch.allclose(new[:, 5:], logits[:, 5:])


@pytest.mark.parametrize("position", [p for p in POSITIONS if p != "learned"])
def test_every_scheme_but_learned_runs_beyond_the_training_length(position):
    model = _model(position)
    ids = torch.randint(0, VOCAB, (2, 32))  # 4x max_len
    long = model(ids)
    assert long.shape == (2, 32, VOCAB) and torch.isfinite(long).all()
    # causal: the first 8 positions of the long pass are the short pass
    torch.testing.assert_close(long[:, :8], model(ids[:, :8]), atol=1e-5, rtol=1e-5)


def test_learned_positions_cannot_extrapolate():
    model = _model("learned")
    model(torch.randint(0, VOCAB, (2, 8)))
    with pytest.raises(ValueError, match="no embedding for position 8"):
        model(torch.randint(0, VOCAB, (2, 9)))


def test_positional_parameters_are_where_each_scheme_puts_them():
    base = count_parameters(_model("none"))
    for position in ("sinusoidal", "rope", "alibi"):  # formulas: no parameters
        assert count_parameters(_model(position)) == base
    assert count_parameters(_model("learned", max_len=8)) == base + 8 * 16
    assert count_parameters(_model("t5", t5_num_buckets=16, t5_max_distance=32)) == base + 16 * 2


def test_relative_schemes_are_shared_across_layers():
    rope = _model("rope")
    assert rope.blocks[0].self_attn.rotary is rope.blocks[1].self_attn.rotary is not None
    t5 = _model("t5")
    assert t5.t5_bias is not None and t5.attention_bias(5).shape == (2, 5, 5)
    torch.testing.assert_close(_model("alibi").attention_bias(5), alibi_bias(2, 5, causal=True))
    assert _model("none").attention_bias(5) is None and _model("rope").attention_bias(5) is None


def test_blocks_are_causal_pre_norm_encoder_layers():
    """Each block computes h = x + Attn(Norm(x)) with a causal mask, then h + FFN(Norm(h))."""
    torch.manual_seed(0)
    model = CausalLM(VOCAB, 16, 1, 2, position="none", ffn="swiglu", norm="rmsnorm").eval()
    block = model.blocks[0]
    x = torch.randn(2, 5, 16)
    attended, _ = block.self_attn(block.attn_block.norm(x), mask=causal_mask(5))
    h = x + attended
    torch.testing.assert_close(block(x, causal=True), h + block.ffn(block.ffn_block.norm(h)))
    assert type(block.ffn).__name__ == "SwiGLU" and type(model.norm_f).__name__ == "RMSNorm"


def _train_three_back(position: str, steps: int = 100) -> float:
    """Train a 1-layer model to output the token 3 steps back; return the last loss."""
    torch.manual_seed(0)
    model = CausalLM(VOCAB, 32, 1, 2, position=position, max_len=12).train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (16, 12), generator=g)
        loss = F.cross_entropy(model(ids)[:, 3:].reshape(-1, VOCAB), ids[:, :-3].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


@pytest.mark.parametrize("position", ["learned", "rope", "t5"])
def test_positions_let_one_layer_look_exactly_three_back(position):
    # Random tokens: only the position says which key is 3 back. Chance is about log(11) = 2.4.
    assert _train_three_back(position) < 0.3


@pytest.mark.parametrize("position", ["none", "alibi"])
def test_without_a_relative_offset_one_layer_cannot_look_three_back(position):
    # With no positions, or only ALiBi's penalty that falls monotonically with distance, one layer
    # cannot prefer the key 3 back over nearer ones: the loss stays near guessing among the
    # tokens seen so far (about 1.7-2.0 nats).
    assert _train_three_back(position) > 1.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"position": "absolute"}, "position must be one of"),
        ({"n_layers": 0}, "n_layers"),
        ({"vocab_size": -1}, "vocab_size"),
        ({"d_model": 10, "n_heads": 4}, "divisible"),
        ({"position": "rope", "d_model": 6, "n_heads": 2}, "head_dim must be even"),
    ],
)
def test_bad_configuration_raises(kwargs, match):
    kw = {"vocab_size": VOCAB, "d_model": 16, "n_heads": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        CausalLM(**kw)


def test_bad_ids_raise():
    model = _model("none")
    with pytest.raises(ValueError, match=r"\(batch, seq\)"):
        model(torch.randint(0, VOCAB, (8,)))
    with pytest.raises(ValueError, match="integer"):
        model(torch.rand(2, 8))
