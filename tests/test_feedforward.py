import pytest
import torch
import torch.nn.functional as F

from companion.feedforward import FeedForward, SwiGLU, activation, matching_swiglu_hidden_size, swiglu_hidden_size
from companion.utils import count_parameters


@pytest.mark.parametrize("activation, fn", [("relu", F.relu), ("gelu", F.gelu), ("silu", F.silu)])
def test_feedforward_matches_equation(activation, fn):
    torch.manual_seed(0)
    ffn = FeedForward(8, 32, activation)
    x = torch.randn(2, 5, 8)
    expected = fn(x @ ffn.w1.weight.T + ffn.w1.bias) @ ffn.w2.weight.T + ffn.w2.bias
    assert torch.allclose(ffn(x), expected, atol=1e-6)


def test_feedforward_is_position_wise_and_a_1x1_convolution():
    torch.manual_seed(0)
    ffn = FeedForward(6, 12)
    x = torch.randn(3, 7, 6)
    out = ffn(x)
    # each position alone gives the same answer: no position sees another
    assert torch.allclose(torch.stack([ffn(x[:, t]) for t in range(7)], dim=1), out, atol=1e-6)
    perm = torch.randperm(7)
    assert torch.allclose(ffn(x[:, perm]), out[:, perm], atol=1e-6)
    conv1 = torch.nn.Conv1d(6, 12, 1)
    conv2 = torch.nn.Conv1d(12, 6, 1)
    with torch.no_grad():
        conv1.weight.copy_(ffn.w1.weight[:, :, None])
        conv1.bias.copy_(ffn.w1.bias)
        conv2.weight.copy_(ffn.w2.weight[:, :, None])
        conv2.bias.copy_(ffn.w2.bias)
    conv_out = conv2(F.relu(conv1(x.transpose(1, 2)))).transpose(1, 2)
    assert torch.allclose(conv_out, out, atol=1e-5)


def test_swiglu_matches_equation_and_llama_mlp_layout():
    torch.manual_seed(0)
    f = SwiGLU(16, 40)
    x = torch.randn(4, 16)
    gate = x @ f.w_gate.weight.T
    expected = (gate * torch.sigmoid(gate) * (x @ f.w_in.weight.T)) @ f.w_out.weight.T
    assert torch.allclose(f(x), expected, atol=1e-6)
    assert count_parameters(f) == 3 * 16 * 40


def test_swiglu_default_width():
    assert swiglu_hidden_size(512) == 1368  # 8/3 · 512 = 1365.3, rounded up to a multiple of 8
    assert swiglu_hidden_size(4096, multiple_of=256) == 11008  # LLaMA-7B's MLP width
    assert SwiGLU(48).d_ff == 128


@pytest.mark.parametrize("d_model, d_ff", [(64, 256), (512, 2048), (30, 100)])
def test_matching_swiglu_has_about_the_same_parameters(d_model, d_ff):
    relu = count_parameters(FeedForward(d_model, d_ff))
    for bias in (False, True):
        h = matching_swiglu_hidden_size(d_model, d_ff, bias=bias)
        swi = count_parameters(SwiGLU(d_model, h, bias=bias))
        per_unit = 3 * d_model + 2 * bias
        assert abs(swi - relu) <= per_unit / 2 + 1
    # the ReLU FFN's biases add (d_ff + d_model) / (3 d_model) units to the 2/3 · d_ff of the weights
    assert abs(matching_swiglu_hidden_size(d_model, d_ff) - 2 * d_ff / 3 - (d_ff + d_model) / (3 * d_model)) <= 0.5


def test_errors():
    with pytest.raises(ValueError, match="d_ff"):
        FeedForward(8, 0)
    with pytest.raises(ValueError, match="activation"):
        FeedForward(8, 16, "tanh")
    with pytest.raises(ValueError, match="d_model"):
        SwiGLU(0)
    with pytest.raises(ValueError, match="d_ff"):
        SwiGLU(8, 0)
    with pytest.raises(ValueError, match="dropout"):
        FeedForward(8, 16, dropout=1.0)
    with pytest.raises(ValueError, match="d_model=8"):
        FeedForward(8, 16)(torch.randn(2, 7))
    with pytest.raises(TypeError, match="floating"):
        SwiGLU(8)(torch.ones(2, 8, dtype=torch.long))


@pytest.mark.parametrize("ffn, cls, act", [("relu", "FeedForward", "relu"), ("gelu_tanh", "FeedForward", "gelu_tanh"),
                                           ("swiglu", "SwiGLU", "silu"), ("geglu", "GatedFeedForward", "gelu_tanh")])
def test_make_ffn_builds_what_the_config_names(ffn, cls, act):
    from companion.config import ModelConfig
    from companion.feedforward import make_ffn

    config = ModelConfig(vocab_size=10, d_model=24, n_heads=2, ffn=ffn, bias=False)
    module = make_ffn(config)
    assert type(module).__name__ == cls and module.activation == act and module.d_ff == config.resolved_d_ff
    x = torch.randn(3, 24)
    if cls == "FeedForward":
        expected = module.w2(activation(act, module.w1(x)))
    else:  # gated: act(x W_gate) * (x W_in), then W_out (GEGLU uses GPT-2's tanh GELU, as T5 v1.1)
        expected = module.w_out(activation(act, module.w_gate(x)) * module.w_in(x))
    torch.testing.assert_close(module(x), expected)
    assert all(p.dim() == 2 for p in module.parameters())  # bias=False reaches every projection
