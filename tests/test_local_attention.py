"""Tests for chunked sliding-window attention, global tokens and the rolling KV cache.

Every output is compared with dense attention under the package's own masks, computed in float64;
memory is measured (saved activations, largest intermediate tensor) at two lengths.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from companion.attention import causal_mask, scaled_dot_product_attention, sliding_window_mask
from companion.attention.local import global_local_attention, sliding_window_attention
from companion.attention.rolling_cache import RollingKVCache
from companion.profiling import saved_tensor_bytes

torch._logging.set_logs(dynamo=logging.ERROR)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def qkv(b=2, h=3, L=13, d=8, dv=None, dtype=torch.float32, requires_grad=False):
    return tuple(torch.randn(b, h, L, n, dtype=dtype, requires_grad=requires_grad) for n in (d, d, dv or d))


def dense(q, k, v, mask, scale=None):
    """softmax(q kᵀ · scale + M) v in float64, the masked reference."""
    q, k, v = (t.double() for t in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def longformer_mask(L, window, positions, causal=False):
    mask = sliding_window_mask(L, window=window, causal=causal).clone()
    mask[positions, :] = True  # global rows: see everything
    mask[:, positions] = True  # global columns: seen by everyone
    return mask & causal_mask(L) if causal else mask


class LargestTensor(TorchDispatchMode):
    """Records the bytes of the largest storage any operation produces (views count their whole storage)."""

    def __init__(self):
        super().__init__()
        self.nbytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.nbytes = max(self.nbytes, t.untyped_storage().nbytes())
        return out


def largest_tensor(fn):
    with LargestTensor() as mode:
        fn()
    return mode.nbytes


# ------------------------------------------------------------------ sliding-window attention


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("L", [1, 7, 37, 64])
@pytest.mark.parametrize("window", [0, 1, 5, 16, 100])
def test_sliding_window_equals_dense_masked_attention(causal, L, window):
    q, k, v = qkv(L=L, dv=5)
    out = sliding_window_attention(q, k, v, window, causal=causal)
    ref = dense(q, k, v, sliding_window_mask(L, window=window, causal=causal))
    assert out.shape == (2, 3, L, 5) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk_size", [4, 5, 11, 64])
def test_any_chunk_size_at_least_the_window_gives_the_same_output(causal, chunk_size):
    q, k, v = qkv(L=30)
    out = sliding_window_attention(q, k, v, 4, causal=causal, chunk_size=chunk_size, scale=0.7)
    ref = dense(q, k, v, sliding_window_mask(30, window=4, causal=causal), scale=0.7)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)


def test_window_zero_is_the_identity_on_values_and_a_long_window_is_full_attention():
    q, k, v = qkv(L=9)
    torch.testing.assert_close(sliding_window_attention(q, k, v, 0), v)  # a query sees only itself
    torch.testing.assert_close(sliding_window_attention(q, k, v, 8, causal=True),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(sliding_window_attention(q, k, v, 8, causal=False),
                               F.scaled_dot_product_attention(q, k, v), atol=1e-6, rtol=1e-5)


def test_leading_dims_broadcast_and_bf16_stays_bf16():
    q, k, v = torch.randn(2, 4, 20, 8), torch.randn(2, 1, 20, 8), torch.randn(1, 1, 20, 8)
    ref = dense(q, k, v, sliding_window_mask(20, window=3))
    torch.testing.assert_close(sliding_window_attention(q, k, v, 3).double(), ref, atol=1e-5, rtol=0)
    out = sliding_window_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 3)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=5e-2, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_gradcheck_float64(causal):
    q, k, v = qkv(b=1, h=1, L=6, d=2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: sliding_window_attention(q, k, v, 2, causal=causal), (q, k, v))
    assert torch.autograd.gradcheck(
        lambda q, k, v: global_local_attention(q, k, v, 1, [0, 4], causal=causal), (q, k, v))


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_equal_dense_masked_attention(causal):
    q, k, v = qkv(L=23, requires_grad=True)
    grad = torch.randn(2, 3, 23, 8)
    ours = torch.autograd.grad(sliding_window_attention(q, k, v, 4, causal=causal), (q, k, v), grad)
    mask = sliding_window_mask(23, window=4, causal=causal)
    ref = torch.autograd.grad(scaled_dot_product_attention(q, k, v, mask)[0], (q, k, v), grad)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_memory_grows_linearly_not_quadratically():
    """Saved activations and the largest intermediate: about 2x for 2L (chunked), about 4x (dense mask)."""
    window, ratios = 16, {}
    for name in ("local", "dense"):
        saved, largest = [], []
        for L in (512, 1024):
            q, k, v = qkv(b=1, h=2, L=L, requires_grad=True)
            if name == "local":
                def fn(q=q, k=k, v=v):
                    return sliding_window_attention(q, k, v, window)
            else:
                mask = sliding_window_mask(L, window=window)

                def fn(q=q, k=k, v=v, mask=mask):
                    return scaled_dot_product_attention(q, k, v, mask)[0]
            saved.append(saved_tensor_bytes(fn))
            largest.append(largest_tensor(fn))
        ratios[name] = (saved[1] / saved[0], largest[1] / largest[0], largest[1])
    saved_ratio, largest_ratio, biggest = ratios["local"]
    assert 1.8 < saved_ratio < 2.3 and 1.8 < largest_ratio < 2.3, ratios
    assert biggest < 2 * 1024 * 1024 * 4 / 8  # far below one (L, L) float32 score matrix per head
    assert ratios["dense"][0] > 3.5 and ratios["dense"][1] > 3.5, ratios


def test_traces_into_one_graph():
    q, k, v = qkv(L=19)
    for fn in (lambda q, k, v: sliding_window_attention(q, k, v, 4),
               lambda q, k, v: global_local_attention(q, k, v, 4, torch.tensor([0, 7]))):
        torch._dynamo.reset()
        explanation = torch._dynamo.explain(fn)(q, k, v)
        assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]


# ------------------------------------------------------------------ global + local (Longformer)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L, window, positions", [
    (13, 2, [0]),  # a [CLS] token
    (37, 4, [0, 5, 36]),  # global tokens inside one another's windows, and the last position
    (20, 0, [3, 11]),
    (16, 30, [2]),  # window longer than the sequence: full attention
    (25, 3, []),  # no global token: plain sliding-window attention
])
def test_global_local_equals_dense_longformer_mask(causal, L, window, positions):
    q, k, v = qkv(L=L, dv=6)
    out = global_local_attention(q, k, v, window, positions, causal=causal)
    ref = dense(q, k, v, longformer_mask(L, window, positions, causal))
    assert out.shape == (2, 3, L, 6)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)
    tensor_positions = torch.tensor(positions, dtype=torch.long)
    torch.testing.assert_close(global_local_attention(q, k, v, window, tensor_positions, causal=causal,
                                                      chunk_size=max(window, 7)), out, atol=1e-6, rtol=0)


def test_global_tokens_change_only_what_they_should():
    q, k, v = qkv(L=30)
    local = sliding_window_attention(q, k, v, 2, causal=False)
    glob = global_local_attention(q, k, v, 2, [10])
    far = [p for p in range(30) if abs(p - 10) > 2]
    assert not torch.allclose(glob[..., far, :], local[..., far, :])  # every query now also sees key 10
    near = [p for p in range(30) if 0 < abs(p - 10) <= 2]
    torch.testing.assert_close(glob[..., near, :], local[..., near, :])  # key 10 was already in their window


def test_global_local_memory_is_linear():
    sizes = []
    for L in (512, 1024):
        q, k, v = qkv(b=1, h=2, L=L, requires_grad=True)
        sizes.append(saved_tensor_bytes(lambda q=q, k=k, v=v: global_local_attention(q, k, v, 16, [0, 100, 300])))
    assert 1.8 < sizes[1] / sizes[0] < 2.3, sizes


# ------------------------------------------------------------------ bad input


def test_bad_inputs():
    q, k, v = qkv(L=10)
    with pytest.raises(ValueError, match="window must be an int >= 0, got -1"):
        sliding_window_attention(q, k, v, -1)
    with pytest.raises(ValueError, match="window must be an int"):
        sliding_window_attention(q, k, v, 2.0)
    with pytest.raises(ValueError, match="chunk_size must be >= window=4"):
        sliding_window_attention(q, k, v, 4, chunk_size=3)
    with pytest.raises(ValueError, match="chunk_size must be an int >= 1"):
        sliding_window_attention(q, k, v, 0, chunk_size=0)
    with pytest.raises(ValueError, match="same length"):
        sliding_window_attention(q[..., :4, :], k, v, 2)
    with pytest.raises(ValueError, match="same head dimension"):
        sliding_window_attention(q[..., :4], k, v, 2)
    with pytest.raises(ValueError, match="causal must be a bool"):
        sliding_window_attention(q, k, v, 2, causal="yes")
    with pytest.raises(ValueError, match="scale must be None or a positive float"):
        sliding_window_attention(q, k, v, 2, scale=0)
    with pytest.raises(ValueError, match=r"distinct positions in \[0, seq=10\), got \[3, 10\]"):
        global_local_attention(q, k, v, 2, [3, 10])
    with pytest.raises(ValueError, match="distinct positions"):
        global_local_attention(q, k, v, 2, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="global_positions must be a 1-D integer tensor"):
        global_local_attention(q, k, v, 2, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="global_positions must be a 1-D integer tensor"):
        global_local_attention(q, k, v, 2, [True])


# ------------------------------------------------------------------ rolling KV cache


def toy_rotary(x, positions):
    """Rotate each pair of features by an angle proportional to the position (RoPE's shape)."""
    angle = positions[:, None].to(x.dtype) * torch.linspace(0.1, 1.0, x.shape[-1] // 2, dtype=x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()], -1).flatten(-2)


class TinyStack:
    """Layers of sliding-window attention with fixed projections and rotary positions, run whole or cached."""

    def __init__(self, n_layers=2, heads=2, head_dim=4, window=3):
        d = heads * head_dim
        self.weights = [torch.randn(3, d, d) / math.sqrt(d) for _ in range(n_layers)]
        self.heads, self.head_dim, self.window = heads, head_dim, window

    def _qkv(self, layer, x, positions):
        b, n, _ = x.shape
        q, k, v = ((x @ w).view(b, n, self.heads, self.head_dim).transpose(1, 2) for w in self.weights[layer])
        return toy_rotary(q, positions), toy_rotary(k, positions), v

    def full(self, x, kernel):
        """The whole sequence, no cache: ``kernel`` is the chunked kernel or the dense masked reference."""
        positions = torch.arange(x.shape[1])
        for layer in range(len(self.weights)):
            q, k, v = self._qkv(layer, x, positions)
            if kernel == "chunked":
                out = sliding_window_attention(q, k, v, self.window)
            else:
                out = dense(q, k, v, sliding_window_mask(x.shape[1], window=self.window)).float()
            x = x + out.transpose(1, 2).flatten(2)
        return x

    def cached(self, x, cache):
        """New tokens ``x`` ``(batch, new, d)`` after those already in ``cache``."""
        start = cache.seq_len()
        positions = torch.arange(start, start + x.shape[1])
        for layer in range(len(self.weights)):
            q, k, v = self._qkv(layer, x, positions)
            k_all, v_all = cache.update(layer, k, v)
            mask = sliding_window_mask(x.shape[1], k_all.shape[2], window=self.window)
            x = x + scaled_dot_product_attention(q, k_all, v_all, mask)[0].transpose(1, 2).flatten(2)
        return x


@pytest.mark.parametrize("prompt", [1, 2, 9])
def test_rolling_cache_decoding_equals_full_sliding_window_attention(prompt):
    window, T = 3, 20  # T several times the window: the ring wraps five times
    stack = TinyStack(window=window)
    x = torch.randn(2, T, 8)
    full = stack.full(x, "chunked")
    torch.testing.assert_close(full, stack.full(x, "dense"), atol=1e-5, rtol=1e-5)
    cache = RollingKVCache(2, 2, 2, 4, window)
    nbytes = cache.memory_bytes
    outs = [stack.cached(x[:, :prompt], cache)]  # prefill (longer than the window when prompt = 9)
    for t in range(prompt, T):
        outs.append(stack.cached(x[:, t:t + 1], cache))
        assert cache.keys.shape == (2, 2, 2, window + 1, 4) and cache.memory_bytes == nbytes
    assert cache.seq_len() == T and cache.stored() == window + 1
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)
    assert nbytes == 2 * 2 * 2 * 2 * (window + 1) * 4 * 4  # keys and values, layers, batch, heads, slots, head_dim


def test_rolling_cache_chunked_prefill_and_reset():
    stack = TinyStack(window=4)
    x = torch.randn(1, 17, 8)
    full = stack.full(x, "dense")
    cache = RollingKVCache(2, 1, 2, 4, 4)
    outs = [stack.cached(x[:, i:i + 3], cache) for i in range(0, 17, 3)]  # chunks of 3, the last of 2
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)
    cache.reset()
    assert cache.seq_len() == 0
    torch.testing.assert_close(stack.cached(x[:, :6], cache), full[:, :6], atol=1e-5, rtol=1e-5)


def test_rolling_cache_ring_slots_and_return_values():
    cache = RollingKVCache(1, 1, 1, 1, window=2)  # 3 slots
    for t in range(5):
        k, _ = cache.update(0, torch.full((1, 1, 1, 1), float(t)), torch.zeros(1, 1, 1, 1))
    assert k.flatten().tolist() == [3.0, 4.0, 2.0]  # position p in slot p mod 3: out of order
    k, _ = cache.update(0, torch.arange(5.0, 10.0).view(1, 1, 5, 1), torch.zeros(1, 1, 5, 1))
    assert k.flatten().tolist() == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]  # the last `window` cached, then the new
    assert cache.keys.flatten().tolist() == [9.0, 7.0, 8.0] and cache.seq_len() == 10


def test_rolling_cache_bad_inputs():
    with pytest.raises(ValueError, match="window must be an int >= 0"):
        RollingKVCache(1, 1, 1, 4, window=-1)
    cache = RollingKVCache(2, 1, 2, 4, window=3)
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 2\)"):
        cache.update(2, torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError, match=r"k and v must both have shape \(batch=1, kv_heads=2"):
        cache.update(0, torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))


# ------------------------------------------------------------------ accelerators (skipped on CPU-only machines)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_equals_dense_and_peak_memory_is_linear():
    device = torch.device("cuda")
    q, k, v = (torch.randn(2, 4, 300, 16, device=device) for _ in range(3))
    for causal in (True, False):
        ref = dense(q, k, v, sliding_window_mask(300, window=20, causal=causal, device=device))
        out = sliding_window_attention(q, k, v, 20, causal=causal)
        assert out.device.type == "cuda"
        torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=0)
        glob = global_local_attention(q, k, v, 20, [0, 150], causal=causal)
        ref = dense(q, k, v, longformer_mask(300, 20, [0, 150], causal).to(device))
        torch.testing.assert_close(glob.double(), ref, atol=1e-4, rtol=0)
    # The products above have already made cuBLAS allocate its workspace: the peaks below are the kernel's own.
    peaks = []
    for L in (8192, 16384):
        q, k, v = (torch.randn(1, 8, L, 64, device=device) for _ in range(3))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        sliding_window_attention(q, k, v, 256)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
    assert 1.7 < peaks[1] / peaks[0] < 2.3, peaks
