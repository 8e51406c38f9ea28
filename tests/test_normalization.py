import pytest
import torch

from companion.normalization import LayerNorm, RMSNorm, make_norm


def _randomise(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
    return module


def test_layernorm_equals_torch():
    torch.manual_seed(0)
    ours = _randomise(LayerNorm(16))
    ref = torch.nn.LayerNorm(16)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 16) * 4 + 2
    assert torch.allclose(ours(x), ref(x), atol=1e-5)


def test_layernorm_without_bias_equals_torch():
    ours = _randomise(LayerNorm(8, bias=False))
    ref = torch.nn.LayerNorm(8, bias=False)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(4, 8)
    assert torch.allclose(ours(x), ref(x), atol=1e-5)


def test_rmsnorm_equals_torch():
    torch.manual_seed(0)
    ours = _randomise(RMSNorm(16, eps=1e-6))
    ref = torch.nn.RMSNorm(16, eps=1e-6)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 16) * 3
    assert torch.allclose(ours(x), ref(x), atol=1e-5)


def test_layernorm_output_statistics():
    y = LayerNorm(32)(torch.randn(10, 32) * 5 + 3)
    assert torch.allclose(y.mean(-1), torch.zeros(10), atol=1e-5)
    assert torch.allclose(y.var(-1, unbiased=False), torch.ones(10), atol=1e-3)


def test_rmsnorm_output_has_unit_rms():
    y = RMSNorm(32)(torch.randn(10, 32) * 5 + 3)
    assert torch.allclose(y.pow(2).mean(-1).sqrt(), torch.ones(10), atol=1e-4)


def test_invariances():
    torch.manual_seed(0)
    x = torch.randn(6, 24)
    ln, rms = _randomise(LayerNorm(24, eps=1e-12)), _randomise(RMSNorm(24, eps=1e-12))
    for c in (0.1, 3.0, 100.0):
        assert torch.allclose(rms(c * x), rms(x), atol=1e-4)
        assert torch.allclose(ln(c * x), ln(x), atol=1e-4)
    shift = 2.5
    assert torch.allclose(ln(x + shift), ln(x), atol=1e-4)
    assert not torch.allclose(rms(x + shift), rms(x), atol=1e-2)  # RMSNorm does not re-centre
    assert not torch.allclose(ln(-x), ln(x), atol=1e-2)  # but a negative scale flips the sign


def test_half_precision_does_not_overflow():
    x = torch.full((2, 64), 300.0, dtype=torch.float16)  # x² = 90000 > fp16 max (65504)
    y = RMSNorm(64)(x)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    assert torch.allclose(y.float(), torch.ones(2, 64), atol=1e-2)


def test_errors():
    with pytest.raises(ValueError, match="d_model"):
        LayerNorm(0)
    with pytest.raises(ValueError, match="eps"):
        RMSNorm(8, eps=0.0)
    with pytest.raises(ValueError, match="d_model=8"):
        LayerNorm(8)(torch.randn(2, 4))
    with pytest.raises(TypeError, match="floating"):
        RMSNorm(8)(torch.ones(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="norm must be one of"):
        make_norm("batchnorm", 8)
    assert isinstance(make_norm("rmsnorm", 8), RMSNorm)
