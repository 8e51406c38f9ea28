"""Tests for companion.attention.tiled: tiled (FlashAttention) attention against PyTorch's SDPA, in value,
gradient, memory kept for backward and arithmetic skipped by the causal mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from companion.attention import causal_mask, scaled_dot_product_attention
from companion.attention.tiled import tiled_attention
from companion.profiling import saved_tensor_bytes


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def qkv(lq, lk, b=2, h=2, d=8, dv=None, dtype=torch.float32, device="cpu", requires_grad=False):
    shapes = [(b, h, lq, d), (b, h, lk, d), (b, h, lk, dv or d)]
    return [torch.randn(s, dtype=dtype, device=device, requires_grad=requires_grad) for s in shapes]


def reference(q, k, v, causal, scale=None):
    """PyTorch's SDPA with the package's causal convention (queries are the last q_len positions)."""
    mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


LENGTHS = [(1, 1), (37, 37), (64, 64), (129, 129), (1, 37), (37, 64), (64, 129)]  # (q_len, k_len)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("q_len,k_len", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_equals_torch_sdpa(causal, q_len, k_len, block_size):
    q, k, v = qkv(q_len, k_len)
    out = tiled_attention(q, k, v, causal=causal, block_size=block_size)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out, reference(q, k, v, causal), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_value_width_and_scale_are_honoured(causal):
    q, k, v = qkv(21, 30, dv=5)
    out = tiled_attention(q, k, v, causal=causal, scale=0.7, block_size=8)
    assert out.shape == (2, 2, 21, 5)
    torch.testing.assert_close(out, reference(q, k, v, causal, scale=0.7), atol=1e-5, rtol=1e-5)


def test_large_scores_do_not_overflow():
    # scores in the thousands: exp() overflows float32 unless each tile is measured against the running max
    q, k, v = qkv(40, 40)
    q = q * 300
    out = tiled_attention(q, k, v, causal=True, block_size=16)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, reference(q.double(), k.double(), v.double(), True).float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("k_len", [1, 37, 129])
def test_one_query_decoding_sees_every_key(k_len):
    # one new query after k_len - 1 cached tokens: causal or not, it attends to all k_len keys
    q, k, v = qkv(1, k_len)
    causal = tiled_attention(q, k, v, causal=True, block_size=16)
    torch.testing.assert_close(causal, F.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(causal, tiled_attention(q, k, v, block_size=16), atol=1e-6, rtol=1e-6)


def test_bf16_inputs_give_bf16_output_close_to_float32():
    q, k, v = qkv(50, 70)
    out = tiled_attention(*(x.bfloat16() for x in (q, k, v)), causal=True, block_size=16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference(q, k, v, True), atol=3e-2, rtol=3e-2)


# ------------------------------------------------------------------ backward by recomputation


@pytest.mark.parametrize("q_len,k_len", [(5, 5), (3, 7), (7, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_float64(causal, q_len, k_len):
    if causal and q_len > k_len:
        pytest.skip("causal needs k_len >= q_len")
    q, k, v = qkv(q_len, k_len, b=1, h=2, d=3, dv=2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: tiled_attention(q, k, v, causal=causal, block_size=2), (q, k, v))


@pytest.mark.parametrize("q_len,k_len", [(37, 37), (37, 64), (1, 50)])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_equal_torch_sdpa(causal, q_len, k_len):
    q, k, v = qkv(q_len, k_len, requires_grad=True)
    grad_out = torch.randn(2, 2, q_len, 8)
    ours = torch.autograd.grad(tiled_attention(q, k, v, causal=causal, block_size=16), (q, k, v), grad_out)
    ref = torch.autograd.grad(reference(q, k, v, causal), (q, k, v), grad_out)
    for name, a, b in zip("qkv", ours, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=lambda m, name=name: f"d{name}: {m}")


def test_memory_kept_for_backward_grows_linearly_not_quadratically():
    def saved(fn, L):
        q, k, v = qkv(L, L, b=1, h=1, d=16, requires_grad=True)
        return saved_tensor_bytes(lambda: fn(q, k, v))

    tiled = [saved(lambda q, k, v: tiled_attention(q, k, v, causal=True, block_size=128), L) for L in (1024, 2048)]
    explicit = [saved(lambda q, k, v: scaled_dot_product_attention(q, k, v)[0], L) for L in (1024, 2048)]
    assert tiled[1] / tiled[0] < 2.2, tiled
    assert explicit[1] / explicit[0] > 3.5, explicit
    # what is kept: q, k, v, the output (L x 16 floats each) and the log-sum-exp (L floats)
    assert tiled[1] == (4 * 2048 * 16 + 2048) * 4
    assert tiled[1] < explicit[1] / 20


def test_causal_skips_the_tiles_above_the_diagonal():
    # 64 positions in blocks of 16: 4 x 4 tiles, of which causal visits 1 + 2 + 3 + 4 = 10 (forward and backward)
    q, k, v = qkv(64, 64, requires_grad=True)

    def flops(causal):
        with FlopCounterMode(display=False) as counter:
            tiled_attention(q, k, v, causal=causal, block_size=16).sum().backward()
        return counter.get_total_flops()

    assert flops(True) / flops(False) == pytest.approx(10 / 16, rel=1e-3)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("block_size", [0, -4, 1.5, True, "64"])
def test_block_size_must_be_a_positive_int(block_size):
    q, k, v = qkv(4, 4)
    with pytest.raises(ValueError, match="block_size"):
        tiled_attention(q, k, v, block_size=block_size)


def test_bad_shapes_are_reported():
    q, k, v = qkv(4, 6)
    with pytest.raises(ValueError, match="head dimension"):
        tiled_attention(q, k[..., :5], v)
    with pytest.raises(ValueError, match="leading"):
        tiled_attention(q, k[:1], v[:1])
    with pytest.raises(ValueError, match="k_len >= q_len"):
        tiled_attention(*qkv(6, 4), causal=True)
    with pytest.raises(ValueError, match="k_len >= 1"):
        tiled_attention(q, k[..., :0, :], v[..., :0, :])
    with pytest.raises(ValueError, match="scale"):
        tiled_attention(q, k, v, scale=0.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_matches_torch_sdpa_forward_and_backward(causal):
    q, k, v = qkv(100, 130, device="cuda", requires_grad=True)
    out = tiled_attention(q, k, v, causal=causal, block_size=32)
    ref = reference(q, k, v, causal)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    grad_out = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v), grad_out)
    theirs = torch.autograd.grad(ref, (q, k, v), grad_out)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
