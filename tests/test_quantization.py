"""Tests for companion.inference.quantization: error bounds, packing, exact bytes, whole models, torchao parity."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.config import ModelConfig
from companion.inference.quantization import (
    QuantLinear,
    dequantize_int4,
    dequantize_int8,
    model_bytes,
    pack_int4,
    quantize_int4,
    quantize_int8,
    quantize_model,
    unpack_int4,
)
from companion.models.gpt import GPT
from companion.models.transformer import Transformer


def _weight(out_features=48, in_features=128, seed=0) -> torch.Tensor:
    """Gaussian rows of very different magnitudes, one all-zero row, one row whose largest |w| is negative."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=g) * torch.logspace(-3, 1, out_features)[:, None]
    w[3] = 0.0
    w[5, 7] = -20.0
    return w


def _gpt(preset="tiny", seed=0, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(ModelConfig.preset(preset, **{"vocab_size": 64, "max_len": 32, **kw})).eval()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# ------------------------------------------------------------------ int8 and int4 round trips


def test_int8_round_trip_is_within_half_a_step_of_each_row():
    w = _weight()
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scale.dtype == torch.float32 and scale.shape == (48,)
    amax = w.abs().amax(1)
    nonzero = amax > 0
    assert torch.equal(scale[nonzero], amax[nonzero] / 127) and scale[3] == 1 and not q[3].any()  # zero row: guarded
    assert torch.equal(q.abs().amax(1)[nonzero], torch.full((47,), 127, dtype=torch.int8))  # the row's max is ±127
    assert q[5, 7] == -127 and int(q.min()) >= -127  # the symmetric grid: −128 is never used
    err = (w - dequantize_int8(q, scale)).abs()
    assert (err <= scale[:, None] / 2 * (1 + 1e-6)).all()
    typical = nonzero.clone()
    typical[5] = False
    assert (err.amax(1)[typical] > scale[typical] / 4).all()  # and the bound is not vacuous
    # one outlier sets its row's step: the row's other (small) weights all round to zero (Dettmers et al., 2022)
    assert q[5].count_nonzero() == 1
    # a bf16 weight quantizes as its float32 values do; the output dtype is chosen at dequantization
    q16, s16 = quantize_int8(w.bfloat16())
    assert torch.equal(q16, quantize_int8(w.bfloat16().float())[0])
    assert dequantize_int8(q16, s16, torch.bfloat16).dtype == torch.bfloat16


def test_int4_round_trip_is_within_half_a_step_of_each_group():
    w = _weight()
    w[0, 64:96] = 0.0  # one all-zero group
    packed, scale = quantize_int4(w, group_size=32)
    assert packed.dtype == torch.uint8 and packed.shape == (48, 64) and scale.shape == (48, 4)
    groups = w.reshape(48, 4, 32)
    amax = groups.abs().amax(-1)
    assert torch.equal(scale[amax > 0], amax[amax > 0] / 7) and scale[0, 2] == 1 and scale[3].eq(1).all()
    q = unpack_int4(packed).reshape(48, 4, 32)
    assert int(q.min()) == -7 and int(q.max()) == 7  # [−7, 7]: the code −8 is left unused
    err = (groups - dequantize_int4(packed, scale, 32, 128).reshape(48, 4, 32)).abs()
    assert (err <= scale[..., None] / 2 * (1 + 1e-6)).all()


def test_pack_int4_round_trips_all_16_values_and_has_the_documented_layout():
    values = torch.arange(-8, 8)
    pairs = torch.cartesian_prod(values, values)  # every value in both nibbles: (256, 2)
    packed = pack_int4(pairs)
    assert packed.dtype == torch.uint8 and packed.shape == (256, 1)
    assert torch.equal(unpack_int4(packed), pairs.to(torch.int8))
    assert sorted(packed.flatten().tolist()) == list(range(256))  # a bijection onto the bytes
    # offset binary, column 2j in the low nibble: (−8, 7) -> 0 | 15 << 4; (1, −1) -> 9 | 7 << 4
    assert pack_int4(torch.tensor([[-8, 7, 1, -1]])).tolist() == [[240, 121]]
    with pytest.raises(ValueError, match=r"q must lie in \[-8, 7\], got min -9"):
        pack_int4(torch.tensor([[-9, 0]]))
    with pytest.raises(ValueError, match="even last dim"):
        pack_int4(torch.tensor([[1, 2, 3]]))


def test_smaller_groups_quantize_more_closely():
    # per weight: a group's step is max|w| / 7 over fewer weights, so smaller on average
    for seed in range(3):
        w = torch.randn(256, 256, generator=torch.Generator().manual_seed(seed))
        errors = [_rel(dequantize_int4(*quantize_int4(w, g), g, 256), w) for g in (16, 32, 64, 256)]
        assert errors == sorted(errors) and errors[0] < 0.8 * errors[-1], errors
    # per model: measured over 30 seeds the int4 logit error with groups of 16 was 0.78 (mean) and at most
    # 0.90 of that with groups of 64 ("tiny"), 0.81 / 0.96 ("llama-tiny"); 16 vs 32 and 32 vs 64 are not
    # reliably ordered there (1 and 9 inversions in 30 seeds), so only the wide gap is asserted
    model = _gpt()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids)
        fine, coarse = (_rel(quantize_model(model, 4, g)(ids), ref) for g in (16, 64))
    assert fine < coarse


# ------------------------------------------------------------------ QuantLinear


@pytest.mark.parametrize("bits, group_size", [(8, 64), (4, 64), (4, 16)])
def test_quant_linear_bytes_output_and_state_dict(bits, group_size):
    torch.manual_seed(0)
    out_features, in_features = 40, 128
    linear = nn.Linear(in_features, out_features)
    layer = QuantLinear.from_linear(linear, bits=bits, group_size=group_size)
    weight_bytes = out_features * in_features if bits == 8 else out_features * in_features // 2
    scale_bytes = 4 * out_features if bits == 8 else 4 * out_features * (in_features // group_size)
    assert layer.nbytes == weight_bytes + scale_bytes + 4 * out_features == model_bytes(layer)
    assert QuantLinear.from_linear(nn.Linear(in_features, out_features, bias=False), bits, group_size).nbytes == (
        weight_bytes + scale_bytes)
    # |x Wᵀ − x Ŵᵀ| ≤ Σ_j |x_j| · max|W_ij − Ŵ_ij| ≤ Σ_j |x_j| · (the row's largest step) / 2
    x = torch.randn(3, 5, in_features)
    with torch.no_grad():
        y, ref = layer(x), linear(x)
    step = layer.scale if bits == 8 else layer.scale.amax(1)
    assert ((y - ref).abs() <= x.abs().sum(-1, keepdim=True) * step / 2 + 1e-5).all()
    assert _rel(y, ref) < (0.01 if bits == 8 else 0.15)
    # a fresh layer of the same shape loads the state dict and computes the same outputs
    fresh = QuantLinear(in_features, out_features, bits=bits, group_size=group_size)
    fresh.load_state_dict(layer.state_dict())
    assert torch.equal(fresh(x), y)
    assert layer(x.bfloat16()).dtype == torch.bfloat16 and torch.equal(layer.weight, layer.dequantized_weight())


def test_bad_arguments_raise_value_errors():
    linear = nn.Linear(96, 8)
    with pytest.raises(ValueError, match=r"bits must be one of \(8, 4\), got 3"):
        QuantLinear.from_linear(linear, bits=3)
    with pytest.raises(ValueError, match=r"bits must be one of \(8, 4\), got 16"):
        quantize_model(nn.Sequential(linear), bits=16)
    with pytest.raises(ValueError, match="group_size must divide in_features, got group_size=64, in_features=96"):
        QuantLinear.from_linear(linear, bits=4, group_size=64)
    for bad in (0, 7, 2.0):
        with pytest.raises(ValueError, match="group_size must be an even int >= 2"):
            quantize_int4(linear.weight, group_size=bad)
    with pytest.raises(ValueError, match="group_size must divide in_features"):
        quantize_int4(linear.weight, group_size=64)
    with pytest.raises(ValueError, match=r"weight must have shape \(out_features, in_features\)"):
        quantize_int8(torch.randn(4))
    with pytest.raises(TypeError, match="weight must be a floating-point torch.Tensor"):
        quantize_int8(torch.ones(2, 2, dtype=torch.long))
    packed, _ = quantize_int4(linear.weight, 32)
    with pytest.raises(ValueError, match=r"scale must have shape \(out_features, in_features / group_size\) = \(8, 3"):
        dequantize_int4(packed, torch.ones(8, 2), 32, 96)


# ------------------------------------------------------------------ whole models


def test_quantize_model_replaces_the_linear_layers_of_a_copy():
    model = _gpt()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids)
        q8, q4 = quantize_model(model, 8), quantize_model(model, 4, 64)
        # measured over 30 seeds: at most 0.52% (int8) and 8.3% (int4, groups of 64) relative logit error
        assert _rel(q8(ids), ref) < 0.01
        assert _rel(q4(ids), ref) < 0.15
        assert torch.equal(model(ids), ref)  # the original is untouched
    linears = [name for name, m in model.named_modules() if type(m) is nn.Linear]
    quantized = [name for name, m in q8.named_modules() if isinstance(m, QuantLinear)]
    assert quantized == [name for name in linears if name != "head"] and len(quantized) == 8
    # the tied head stays the embedding: one float Parameter, not a second (int) copy
    assert type(q8.head) is nn.Linear and q8.head.weight is q8.tok_emb.weight
    saved = sum(4 * m.weight.numel() - (m.weight.numel() + 4 * m.out_features)
                for name, m in model.named_modules() if name in quantized)
    assert model_bytes(model) - model_bytes(q8) == saved
    # an untied head is kept by name, or quantized when skip is empty
    llama = _gpt("llama-tiny", d_ff=192)
    assert type(quantize_model(llama, 4, 32).head) is nn.Linear
    assert isinstance(quantize_model(llama, 4, 32, skip=()).head, QuantLinear)
    with pytest.raises(ValueError, match="group_size=32 for 'stack.layers.0.ffn.w_out' with in_features=176"):
        quantize_model(_gpt("llama-tiny"), 4, 32)  # SwiGLU's default d_ff = 176 is not a multiple of 32


def test_quantized_encoder_decoder_cross_attention_reads_the_dequantized_weight():
    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("transformer-tiny", vocab_size=11, tgt_vocab_size=13)).eval()
    src, tgt = torch.randint(1, 11, (2, 7)), torch.randint(1, 13, (2, 5))
    with torch.no_grad():
        assert _rel(quantize_model(model, 8)(src, tgt), model(src, tgt)) < 0.01


# ------------------------------------------------------------------ torchao parity


def test_int8_matches_torchao_int8_weight_only():
    """torchao 0.18 ``Int8WeightOnlyConfig``: scale = max|w| / 127.5 on [−128, 127]; ours: max|w| / 127 on [−127, 127].

    torchao's ``choose_qparams_affine`` (SYMMETRIC) divides the row's max by ``(qmax − qmin) / 2 =
    127.5``, clamps the scale to float32's eps and rounds ``w · (1 / s)`` half-to-even into
    [−128, 127]; a row's positive max lands on 127.5 and is clipped to 127 (half a step of error).
    Given the same scales the integers and dequantized weights are identical; with each its own,
    they agree within one of our steps, since both are within half a step of the weight.
    """
    pytest.importorskip("torchao")
    from torchao.quantization import Int8Tensor, Int8WeightOnlyConfig, PerRow, quantize_

    torch.manual_seed(0)
    linear = nn.Linear(128, 48)
    with torch.no_grad():
        linear.weight.copy_(_weight())
    w = linear.weight.detach().clone()
    q, scale = quantize_int8(w)
    ours = dequantize_int8(q, scale)
    same_scale = Int8Tensor.from_hp(w, granularity=PerRow(), scale=scale[:, None])
    assert torch.equal(same_scale.qdata, q) and torch.equal(same_scale.dequantize(), ours)

    ao = nn.Sequential(nn.Linear(128, 48))
    ao.load_state_dict({"0.weight": w, "0.bias": linear.bias.detach()})
    quantize_(ao, Int8WeightOnlyConfig(set_inductor_config=False))  # False: leave inductor's global config alone
    theirs = ao[0].weight
    nonzero = w.abs().amax(1) > 0
    torch.testing.assert_close(theirs.scale.flatten()[nonzero], w.abs().amax(1)[nonzero] / 127.5, rtol=0, atol=0)
    torch.testing.assert_close(theirs.scale.flatten()[nonzero] * 127.5, scale[nonzero] * 127)  # both: the row's max
    assert (theirs.dequantize() - ours).abs().le(scale[:, None] * (1 + 1e-6)).all()  # within one step
    x = torch.randn(4, 128)
    with torch.no_grad():
        y_ao, y = ao(x), QuantLinear.from_linear(linear)(x)
    # weight-only: x times the dequantized W (torchao applies the scale after the matmul: float rounding differs)
    torch.testing.assert_close(y_ao, F.linear(x, theirs.dequantize(), linear.bias), rtol=1e-5, atol=1e-5)
    assert ((y - y_ao).abs() <= x.abs().sum(-1, keepdim=True) * scale + 1e-5).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("bits", [8, 4])
def test_cuda_matches_cpu(bits):
    torch.manual_seed(0)
    linear = nn.Linear(128, 64)
    layer = QuantLinear.from_linear(linear, bits, 32)
    gpu = QuantLinear.from_linear(linear.cuda(), bits, 32)
    assert gpu.qweight.is_cuda and torch.equal(gpu.qweight.cpu(), layer.qweight)
    torch.testing.assert_close(gpu.scale.cpu(), layer.scale)
    x = torch.randn(3, 128)
    torch.testing.assert_close(gpu(x.cuda()).cpu(), layer(x), rtol=1e-4, atol=1e-4)
    assert gpu(x.cuda().half()).dtype == torch.half
