"""Tests for companion.attention: against PyTorch's references, by properties, and every bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.attention import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    combine_masks,
    fused_attention,
    kv_cache_bytes,
    mask_to_bias,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def qkv(b=2, h=3, lq=5, lk=7, d=8, dv=None, dtype=torch.float32):
    return (
        torch.randn(b, h, lq, d, dtype=dtype),
        torch.randn(b, h, lk, d, dtype=dtype),
        torch.randn(b, h, lk, dv or d, dtype=dtype),
    )


def copy_from_torch(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        ours.in_proj.weight.copy_(ref.in_proj_weight)
        ours.in_proj.bias.copy_(ref.in_proj_bias)
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        ours.out_proj.bias.copy_(ref.out_proj.bias)


# ------------------------------------------------------------------ scaled dot-product attention


def test_sdpa_hand_computed_example():
    # one query aligned with the first of two keys: weights softmax([1, 0] / sqrt(2))
    q = torch.tensor([[1.0, 0.0]])
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    v = torch.tensor([[10.0, 0.0], [0.0, 10.0]])
    out, w = scaled_dot_product_attention(q, k, v)
    a = math.exp(1 / math.sqrt(2))
    expected = torch.tensor([[a / (a + 1), 1 / (a + 1)]])
    torch.testing.assert_close(w, expected)
    torch.testing.assert_close(out, 10 * expected)


def test_sdpa_formula_rows_sum_to_one_and_match_torch_math():
    q, k, v = qkv(dv=4)
    out, w = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5))
    ref_w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), dim=-1)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 1, 1, 7), (2, 3, 5, 7), (1, 3, 1, 7)])
def test_sdpa_mask_matches_torch_sdpa(mask_shape):
    q, k, v = qkv()
    mask = torch.rand(mask_shape) > 0.3
    mask[..., 0] = True  # every row keeps a key, so torch's reference is defined everywhere
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    assert (w.masked_select(~mask.expand_as(w)) == 0).all()
    torch.testing.assert_close(fused_attention(q, k, v, mask=mask), ref, atol=1e-6, rtol=1e-5)


def test_sdpa_bias_and_mask_match_torch_float_mask():
    q, k, v = qkv()
    bias = torch.randn(1, 3, 5, 7)
    mask = causal_mask(5, 7)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.masked_fill(~mask, float("-inf")))
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fused_attention(q, k, v, mask=mask, bias=bias), ref, atol=1e-6, rtol=1e-5)


def test_sdpa_custom_scale():
    q, k, v = qkv()
    out, _ = scaled_dot_product_attention(q, k, v, scale=1.0)
    ref = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused_attention(q, k, v, scale=1.0), ref)


@pytest.mark.parametrize("with_bias", [False, True])
def test_fully_masked_rows_are_zero_not_nan_with_finite_gradients(with_bias):
    q, k, v = (t.requires_grad_() for t in qkv())
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False  # query 2 may attend to nothing
    bias = torch.randn(5, 7) if with_bias else None
    out, w = scaled_dot_product_attention(q, k, v, mask=mask, bias=bias)
    fused = fused_attention(q, k, v, mask=mask, bias=bias)
    for o in (out, fused):
        assert torch.isfinite(o).all()
        assert (o[:, :, 2] == 0).all()
    assert (w[:, :, 2] == 0).all()
    torch.testing.assert_close(out, fused, atol=1e-6, rtol=1e-5)
    (out.sum() + fused.sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[:, :, 2] == 0).all()


def test_dropout_on_weights():
    q, k, v = qkv()
    torch.manual_seed(1)
    out_drop, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    out_plain, w_plain = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(w, w_plain)  # weights are reported before dropout
    assert not torch.allclose(out_drop, out_plain)
    # dropout zeroes whole weights: the output is (mask * w / 0.5) @ v for some 0/1 mask
    torch.manual_seed(1)
    keep = F.dropout(torch.ones_like(w), p=0.5)
    torch.testing.assert_close(out_drop, (keep * w) @ v)


def test_gradcheck_explicit_path_float64():
    q, k, v = (t.requires_grad_() for t in qkv(b=1, h=2, lq=3, lk=4, d=3, dtype=torch.float64))
    mask = causal_mask(3, 4)
    mask[0] = False  # include an all-masked row
    bias = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, b: scaled_dot_product_attention(q, k, v, mask=mask, bias=b)[0], (q, k, v, bias)
    )


# ------------------------------------------------------------------ masks


def test_causal_mask_square_and_offset():
    assert torch.equal(causal_mask(3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))
    # cached decoding: 2 new queries after 3 cached tokens; query i sees keys <= i + 3
    m = causal_mask(2, 5)
    assert torch.equal(m, torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool))
    assert causal_mask(1, 6).all()


def test_sliding_window_mask():
    m = sliding_window_mask(5, window=1)
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool
    )
    assert torch.equal(m, expected)
    both = sliding_window_mask(4, window=1, causal=False)
    assert torch.equal(both, both.T) and both.sum().item() == 4 + 2 * 3
    # a window as long as the sequence is the causal mask; with an offset too
    assert torch.equal(sliding_window_mask(3, 6, window=10), causal_mask(3, 6))
    assert sliding_window_mask(2, 6, window=2).sum(-1).tolist() == [3, 3]


def test_padding_mask_from_lengths_and_ids():
    m = padding_mask([2, 4])
    assert m.shape == (2, 1, 1, 4)
    assert m[:, 0, 0].tolist() == [[True, True, False, False], [True, True, True, True]]
    assert padding_mask(torch.tensor([1]), max_len=3)[0, 0, 0].tolist() == [True, False, False]
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 0]])
    assert torch.equal(padding_mask(ids=ids, pad_id=0)[:, 0, 0], ids != 0)


def test_combine_masks_and_mask_to_bias():
    c = combine_masks(causal_mask(4), None, padding_mask([3, 4]))
    assert c.shape == (2, 1, 4, 4)
    assert not c[0, 0, 3, 3] and c[1, 0, 3, 3] and not c[1, 0, 0, 1]
    assert combine_masks(None, None) is None
    b = mask_to_bias(causal_mask(2))
    assert b.tolist() == [[0.0, float("-inf")], [0.0, 0.0]]


# ------------------------------------------------------------------ multi-head attention


def test_explicit_and_fused_paths_agree():
    mha = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 9, 32)
    mask = combine_masks(causal_mask(9), padding_mask([6, 9]))
    bias = torch.randn(1, 4, 9, 9)
    for kw in ({}, {"mask": mask}, {"bias": bias, "mask": mask}):
        fused, none = mha(x, **kw)
        explicit, w = mha(x, need_weights=True, **kw)
        assert none is None and w.shape == (2, 4, 9, 9)
        torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)
    # causal=True takes the is_causal kernel on the fused path
    torch.testing.assert_close(mha(x, causal=True)[0], mha(x, mask=causal_mask(9), need_weights=True)[0],
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("masking", ["none", "key_padding", "causal", "both"])
def test_matches_torch_multihead_attention(masking, need_weights):
    d, h, b, L = 32, 4, 3, 7
    ref = nn.MultiheadAttention(d, h, batch_first=True).eval()
    ours = MultiHeadAttention(d, h).eval()
    copy_from_torch(ours, ref)
    x = torch.randn(b, L, d)
    lengths = [7, 4, 2]
    kpm = None if masking in ("none", "causal") else ~padding_mask(lengths)[:, 0, 0]  # torch: True = ignore
    attn_mask = None if masking in ("none", "key_padding") else ~causal_mask(L)
    ref_out, ref_w = ref(x, x, x, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=True,
                         average_attn_weights=False)
    mask = combine_masks(
        None if kpm is None else ~kpm[:, None, None, :], None if attn_mask is None else ~attn_mask
    )
    out, w = ours(x, mask=mask, need_weights=need_weights)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)
    if need_weights:
        torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)


def test_cross_attention_matches_torch():
    d, h = 24, 3
    ref = nn.MultiheadAttention(d, h, batch_first=True).eval()
    ours = MultiHeadAttention(d, h).eval()
    copy_from_torch(ours, ref)
    x, ctx = torch.randn(2, 4, d), torch.randn(2, 9, d)
    kpm = ~padding_mask([9, 5])[:, 0, 0]
    ref_out, ref_w = ref(x, ctx, ctx, key_padding_mask=kpm, average_attn_weights=False)
    out, w = ours(x, context=ctx, mask=~kpm[:, None, None, :], need_weights=True)
    assert out.shape == (2, 4, d) and w.shape == (2, 3, 4, 9)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours(x, context=ctx, mask=~kpm[:, None, None, :])[0], ref_out, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("need_weights", [False, True])
def test_causality_earlier_outputs_bit_identical(need_weights):
    mha = MultiHeadAttention(16, 2).eval()
    x = torch.randn(1, 10, 16)
    y = x.clone()
    y[:, 6:] = torch.randn(1, 4, 16)  # change the future
    with torch.no_grad():
        a = mha(x, causal=True, need_weights=need_weights)[0]
        b = mha(y, causal=True, need_weights=need_weights)[0]
        c = mha(x, mask=causal_mask(10), need_weights=need_weights)[0]
        d = mha(y, mask=causal_mask(10), need_weights=need_weights)[0]
    assert torch.equal(a[:, :6], b[:, :6]) and torch.equal(c[:, :6], d[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("need_weights", [False, True])
def test_padding_invariance(need_weights):
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 8, 16)
    mask = padding_mask([5, 8])
    noisy = x.clone()
    noisy[0, 5:] = 100 * torch.randn(3, 16)  # garbage in the padding of sequence 0
    with torch.no_grad():
        a = mha(x, mask=mask, need_weights=need_weights)[0]
        b = mha(noisy, mask=mask, need_weights=need_weights)[0]
        alone = mha(x[:1, :5], need_weights=need_weights)[0]  # the sequence without any padding
    torch.testing.assert_close(a[0, :5], b[0, :5], atol=1e-6, rtol=0)
    torch.testing.assert_close(a[0, :5], alone[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(a[1], b[1], atol=0, rtol=0)


def test_permutation_equivariance_without_positions():
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    perm = torch.randperm(6)
    with torch.no_grad():
        out = mha(x)[0]
        out_perm = mha(x[:, perm])[0]
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_gqa_equals_mha_with_shared_kv_weights(n_kv_heads):
    """GQA is MHA whose heads in a group share K/V weights: build that MHA and compare."""
    d, h = 32, 4
    head_dim, group = d // h, h // n_kv_heads
    gqa = MultiHeadAttention(d, h, n_kv_heads=n_kv_heads).eval()
    mha = MultiHeadAttention(d, h).eval()
    with torch.no_grad():
        def rep(w):  # (kv_heads * head_dim, ...) -> (heads * head_dim, ...), consecutive heads share
            grouped = w.view(n_kv_heads, 1, head_dim, *w.shape[1:]).expand(-1, group, -1, *w.shape[1:])
            return grouped.reshape(h * head_dim, *w.shape[1:])
        for src, dst in ((gqa.in_proj.weight, mha.in_proj.weight), (gqa.in_proj.bias, mha.in_proj.bias)):
            nn.init.normal_(src)  # non-zero biases too
            wq, wk, wv = src.split([d, n_kv_heads * head_dim, n_kv_heads * head_dim])
            dst.copy_(torch.cat([wq, rep(wk), rep(wv)]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    assert gqa.in_proj.weight.shape[0] == d + 2 * n_kv_heads * head_dim
    x = torch.randn(2, 5, d)
    for nw in (False, True):
        torch.testing.assert_close(gqa(x, causal=True, need_weights=nw)[0], mha(x, causal=True, need_weights=nw)[0],
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("masked", [False, True])
def test_gqa_fused_path_passes_shared_kv_heads_without_copying_them(monkeypatch, masked):
    # the fused kernel gets h_kv key/value heads (enable_gqa), not an h/h_kv-fold copy (no copy is made;
    # the reads shrink only where the kernel serves a group in one pass), and the output equals the
    # copying (explicit) path
    from companion.attention import KVCache

    torch.manual_seed(0)
    gqa = MultiHeadAttention(32, 8, n_kv_heads=2).eval()
    x = torch.randn(2, 9, 32)
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    if masked:
        mask[1, ..., :3] = False  # left padding in the second row
    m = mask if masked else None
    expected, _ = gqa(x, mask=m, causal=True, need_weights=True)  # the explicit path repeats K and V
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((q.shape[1], k.shape[1], kw.get("enable_gqa", False)))
        return real_sdpa(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(MultiHeadAttention, "_repeat_kv", lambda self, t: pytest.fail("fused path copied K/V"))
    torch.testing.assert_close(gqa(x, mask=m, causal=True)[0], expected, atol=1e-5, rtol=1e-5)
    cache = KVCache(1, 2, 2, 4, 16)  # one layer, batch 2, 2 kv heads of width 4, 16 positions
    gqa(x[:, :8], mask=None if m is None else m[..., :8], causal=True, cache=cache)
    step, _ = gqa(x[:, 8:], mask=m, causal=True, cache=cache)  # one cached decoding step
    torch.testing.assert_close(step, expected[:, 8:], atol=1e-5, rtol=1e-5)
    assert calls and all(c == (8, 2, True) for c in calls), calls


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype, masked, native", [(torch.float16, False, True), (torch.float32, False, False),
                                                   (torch.float16, True, False)])
def test_cuda_gqa_hands_shared_heads_over_only_to_kernels_that_read_them(monkeypatch, dtype, masked, native):
    # on CUDA only FlashAttention (half precision, no mask) reads shared heads; otherwise the heads are
    # repeated, so that the memory-efficient kernel, not the math fallback, serves the call
    torch.manual_seed(0)
    gqa = MultiHeadAttention(64, 8, n_kv_heads=2).to("cuda", dtype).eval()
    x = torch.randn(2, 16, 64, device="cuda", dtype=dtype)
    mask = torch.ones(2, 1, 1, 16, dtype=torch.bool, device="cuda") if masked else None
    expected, _ = gqa(x, mask=mask, causal=True, need_weights=True)
    repeats = []
    real = MultiHeadAttention._repeat_kv
    monkeypatch.setattr(MultiHeadAttention, "_repeat_kv", lambda self, t: repeats.append(1) or real(self, t))
    got, _ = gqa(x, mask=mask, causal=True)
    torch.testing.assert_close(got.float(), expected.float(), atol=1e-2, rtol=1e-2)
    assert (not repeats) == native


def test_gqa_with_n_kv_heads_equal_to_n_heads_is_mha():
    ref = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    ours = MultiHeadAttention(16, 4, n_kv_heads=4).eval()
    copy_from_torch(ours, ref)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(ours(x)[0], ref(x, x, x, need_weights=False)[0], atol=1e-5, rtol=1e-4)


def test_bf16_autocast_on_cpu_close_to_fp32():
    mha = MultiHeadAttention(64, 4).eval()
    x = torch.randn(2, 16, 64)
    ref = mha(x, causal=True)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = mha(x, causal=True)[0]
        explicit, w = mha(x, causal=True, need_weights=True)
    assert fused.dtype == torch.bfloat16 and explicit.dtype == torch.bfloat16
    for out in (fused, explicit):
        err = (out.float() - ref).abs().max().item()
        assert err < 0.05 * ref.abs().max().item(), err
    torch.testing.assert_close(w.float().sum(-1), torch.ones(2, 4, 16), atol=2e-2, rtol=0)


def test_gradients_flow_and_gradcheck_module_float64():
    mha = MultiHeadAttention(8, 2, n_kv_heads=1).double().eval()
    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    ctx = torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: mha(x, causal=True, need_weights=True)[0], (x,))
    assert torch.autograd.gradcheck(lambda x, c: mha(x, context=c, need_weights=True)[0], (x, ctx))
    out = mha(x, causal=True)[0]  # fused path
    out.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mha.parameters())


def test_dropout_only_in_training_mode():
    mha = MultiHeadAttention(16, 2, dropout=0.5)
    x = torch.randn(1, 6, 16)
    mha.train()
    assert not torch.allclose(mha(x)[0], mha(x)[0])
    mha.eval()
    assert torch.equal(mha(x)[0], mha(x)[0])


# ------------------------------------------------------------------ KV cache


class TinyDecoder(nn.Module):
    """Embedding + attention-only residual layers + unembedding: enough to test cached decoding."""

    def __init__(self, vocab=11, d=16, heads=4, kv_heads=2, layers=2, rotary=None):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(
            MultiHeadAttention(d, heads, kv_heads, rotary=rotary, layer_idx=i) for i in range(layers)
        )
        self.head = nn.Linear(d, vocab)

    def forward(self, ids, cache=None, need_weights=False):
        x = self.emb(ids)
        for layer in self.layers:
            x = x + layer(x, cache=cache, causal=True, need_weights=need_weights)[0]
        return self.head(x)


def toy_rotary(x, positions):
    """A rotation of each (even, odd) pair by an angle proportional to the position (RoPE's shape)."""
    angle = positions.to(x.dtype)[..., :, None] * 0.3  # (seq, 1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin = angle.cos(), angle.sin()
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("rotary", [None, toy_rotary])
def test_cached_generation_equals_full_forward(need_weights, rotary):
    model = TinyDecoder(rotary=rotary).eval()
    ids = torch.randint(0, 11, (2, 9))
    with torch.no_grad():
        full = model(ids, need_weights=need_weights)
        cache = KVCache(len(model.layers), batch_size=2, n_kv_heads=2, head_dim=4, max_len=12)
        prefill = model(ids[:, :4], cache=cache, need_weights=need_weights)  # a prompt of 4 tokens
        steps = [model(ids[:, t : t + 1], cache=cache, need_weights=need_weights) for t in range(4, 9)]
    cached = torch.cat([prefill, *steps], dim=1)
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)
    assert cache.seq_len(0) == cache.seq_len(1) == 9
    # the cache holds kv_heads, not heads: 2 (K and V) x layers x kv_heads x head_dim x tokens x batch x 4 bytes
    expected = 2 * 2 * 2 * 4 * 12 * 4 * 2
    assert cache.memory_bytes == kv_cache_bytes(2, 2, 4, 12, bytes_per_element=4, batch_size=2) == expected


def test_rotary_hook_sees_offset_positions():
    seen = []

    def spy(x, positions):
        seen.append(positions.tolist())
        return x

    mha = MultiHeadAttention(8, 2, rotary=spy)
    cache = KVCache(1, 1, 2, 4, max_len=8)
    mha(torch.randn(1, 3, 8), cache=cache)
    mha(torch.randn(1, 1, 8), cache=cache)
    mha(torch.randn(1, 2, 8), positions=torch.tensor([7, 9]))
    mha(torch.randn(1, 2, 8), context=torch.randn(1, 4, 8))  # cross-attention: not rotated
    assert seen == [[0, 1, 2]] * 2 + [[3]] * 2 + [[7, 9]] * 2


def test_cross_attention_cache_is_computed_once():
    mha = MultiHeadAttention(16, 4, n_kv_heads=2).eval()
    enc = torch.randn(1, 6, 16)
    dec = torch.randn(1, 3, 16)
    cache = KVCache(1, 1, 2, 4, max_len=6)
    with torch.no_grad():
        full = mha(dec, context=enc)[0]
        first = mha(dec[:, :1], context=enc, cache=cache)[0]
        rest = [mha(dec[:, t : t + 1], context=torch.zeros_like(enc), cache=cache)[0] for t in (1, 2)]
    torch.testing.assert_close(torch.cat([first, *rest], 1), full, atol=1e-6, rtol=1e-5)
    assert cache.seq_len(0) == 6 and cache.memory_bytes == kv_cache_bytes(1, 2, 4, 6, 4)


def test_cache_is_preallocated_and_resets():
    assert kv_cache_bytes(32, 8, 128, 4096) == 2 * 32 * 8 * 128 * 4096 * 2  # fp16 default
    cache = KVCache(3, 1, 2, 4, max_len=5)
    assert cache.memory_bytes == kv_cache_bytes(3, 2, 4, 5, 4) and len(cache) == 3 and cache.get(1) is None
    storage = cache.keys.data_ptr()
    k = torch.randn(1, 2, 3, 4)
    keys, values = cache.update(1, k, -k)
    assert cache.keys.data_ptr() == storage and keys.data_ptr() == storage + cache.keys[1].storage_offset() * 4
    torch.testing.assert_close(keys, k)
    torch.testing.assert_close(cache.update(1, k[:, :, :2], k[:, :, :2])[1], torch.cat([-k, k[:, :, :2]], 2))
    assert cache.seq_len(1) == 5 and cache.seq_len(0) == 0
    cache.reorder(torch.tensor([0, 0]))  # two beams continuing the same parent
    assert cache.keys.shape[1] == 2 and torch.equal(cache.get(1)[0][0], cache.get(1)[0][1])
    cache.reset()
    assert cache.seq_len(1) == 0 and cache.get(1) is None


# ------------------------------------------------------------------ bad input


def test_bad_module_arguments():
    with pytest.raises(ValueError, match="d_model must be divisible by n_heads.*d_model=30, n_heads=4"):
        MultiHeadAttention(30, 4)
    with pytest.raises(ValueError, match="n_kv_heads must divide n_heads.*n_heads=4, n_kv_heads=3"):
        MultiHeadAttention(32, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="n_heads must be an int >= 1"):
        MultiHeadAttention(32, 0)
    with pytest.raises(ValueError, match="dropout must be a float in"):
        MultiHeadAttention(32, 4, dropout=1.0)
    with pytest.raises(ValueError, match="scale must be None or a positive"):
        MultiHeadAttention(32, 4, scale=-1.0)
    with pytest.raises(TypeError, match="rotary must be None or a callable"):
        MultiHeadAttention(32, 4, rotary=3)


def test_bad_forward_inputs():
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seq, d_model=16\), got \(2, 5, 12\)"):
        mha(torch.randn(2, 5, 12))
    with pytest.raises(ValueError, match=r"x must have shape.*got \(5, 16\)"):
        mha(torch.randn(5, 16))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        mha(torch.ones(2, 5, 16, dtype=torch.long))
    with pytest.raises(ValueError, match=r"context must have shape \(batch=2, k_len, d_model=16\), got \(2, 7, 8\)"):
        mha(x, context=torch.randn(2, 7, 8))
    with pytest.raises(ValueError, match=r"context must have shape \(batch=2.*got \(3, 7, 16\)"):
        mha(x, context=torch.randn(3, 7, 16))
    with pytest.raises(ValueError, match=r"mask must be a bool tensor.*got dtype torch.float32"):
        mha(x, mask=torch.ones(5, 5))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 4\) does not broadcast.*\(2, 4, 5, 5\)"):
        mha(x, mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 1, 1, 5\) does not broadcast"):
        mha(x, mask=padding_mask([5, 5, 5]))
    with pytest.raises(ValueError, match=r"bias of shape \(5, 6\) does not broadcast"):
        mha(x, bias=torch.zeros(5, 6))
    with pytest.raises(TypeError, match="bias must be a floating-point"):
        mha(x, bias=torch.zeros(5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        mha(x, cache={})
    rot = MultiHeadAttention(16, 4, rotary=lambda t, p: t)
    with pytest.raises(ValueError, match=r"positions must have shape \(q_len,\)=\(5,\)"):
        rot(x, positions=torch.arange(4))
    with pytest.raises(TypeError, match="positions must be a real-valued tensor"):
        rot(x, positions=torch.zeros(5, dtype=torch.bool))


def test_bad_sdpa_inputs():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q and k must have the same head dimension.*\(2, 3, 5, 8\).*\(2, 3, 7, 6\)"):
        scaled_dot_product_attention(q, torch.randn(2, 3, 7, 6), v)
    with pytest.raises(ValueError, match=r"k and v must have the same length k_len"):
        fused_attention(q, k, torch.randn(2, 3, 6, 8))
    with pytest.raises(ValueError, match="do not broadcast together"):
        scaled_dot_product_attention(q, torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8))
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        scaled_dot_product_attention([[1.0]], k, v)
    with pytest.raises(ValueError, match="q must have at least 2 dimensions"):
        scaled_dot_product_attention(torch.randn(8), k, v)
    with pytest.raises(TypeError, match="q, k and v must share a dtype"):
        scaled_dot_product_attention(q.double(), k, v)
    with pytest.raises(ValueError, match="dropout_p must be a float in"):
        scaled_dot_product_attention(q, k, v, dropout_p=-0.1)
    with pytest.raises(ValueError, match=r"mask must be a bool tensor"):
        fused_attention(q, k, v, mask=torch.ones(5, 7, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"mask of shape \(7, 5\) does not broadcast"):
        fused_attention(q, k, v, mask=torch.ones(7, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="is_causal=True needs"):
        fused_attention(q, k, v, is_causal=True)  # q_len != k_len


def test_bad_mask_builder_inputs():
    with pytest.raises(ValueError, match="q_len must be an int >= 1"):
        causal_mask(0)
    with pytest.raises(ValueError, match="k_len must be an int >= 1"):
        causal_mask(3, 2.5)
    with pytest.raises(ValueError, match="window must be an int >= 0"):
        sliding_window_mask(4, window=-1)
    with pytest.raises(ValueError, match="exactly one of lengths= or ids="):
        padding_mask()
    with pytest.raises(ValueError, match="exactly one of lengths= or ids="):
        padding_mask([2], ids=torch.zeros(1, 2, dtype=torch.long), pad_id=0)
    with pytest.raises(ValueError, match="pad_id must be an int"):
        padding_mask(ids=torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids must be an integer tensor of shape \(batch, seq\)"):
        padding_mask(ids=torch.zeros(2), pad_id=0)
    with pytest.raises(ValueError, match="max_len=2 is shorter than the longest sequence"):
        padding_mask([3, 1], max_len=2)
    with pytest.raises(ValueError, match="non-negative"):
        padding_mask([3, -1])
    with pytest.raises(ValueError, match="lengths must be a sequence of ints"):
        padding_mask([2.0, 1.0])
    with pytest.raises(ValueError, match=r"mask #1 of shape \(3, 3\) does not broadcast"):
        combine_masks(causal_mask(4), causal_mask(3))
    with pytest.raises(ValueError, match="mask #0 must be a bool tensor"):
        combine_masks(torch.ones(2, 2))
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        mask_to_bias(torch.ones(2))


def test_bad_cache_inputs():
    cache = KVCache(2, 1, 2, 4, max_len=4)
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 2\), got 2"):
        cache.update(2, torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4))
    with pytest.raises(ValueError, match=r"k and v must both have shape \(batch=1, kv_heads=2, new, head_dim=4\)"):
        cache.update(0, torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 2, 4))
    cache.update(0, torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="holds max_len=4 tokens per layer; appending 2 to the 3 stored"):
        cache.update(0, torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4))
    with pytest.raises(ValueError, match="n_layers must be an int >= 1"):
        KVCache(0, 1, 1, 1, 1)
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        KVCache(1, 1, 1, 1, 1, dtype=torch.long)
    with pytest.raises(ValueError, match="index must be a 1-D integer tensor"):
        cache.reorder(torch.tensor([0.0]))
    with pytest.raises(ValueError, match="n_tokens must be an int >= 0"):
        kv_cache_bytes(1, 1, 1, -1)
    # a cache made for another number of kv heads is caught, by name
    gqa = MultiHeadAttention(16, 4, n_kv_heads=1)
    with pytest.raises(ValueError, match=r"k and v must both have shape \(batch=1, kv_heads=2"):
        gqa(torch.randn(1, 1, 16), cache=cache)


# ------------------------------------------------------------------ accelerators (skipped on CPU-only machines)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_paths_agree_and_follow_the_device():
    device = torch.device("cuda")
    mha = MultiHeadAttention(64, 4, n_kv_heads=2).to(device).eval()
    x = torch.randn(2, 33, 64, device=device)
    mask = combine_masks(causal_mask(33, device=device), padding_mask([0, 20], max_len=33, device=device))
    with torch.no_grad():
        fused = mha(x, mask=mask)[0]
        explicit = mha(x, mask=mask, need_weights=True)[0]
        causal_fused = mha(x, causal=True)[0]
    assert fused.device.type == "cuda" and torch.isfinite(fused).all() and torch.isfinite(explicit).all()
    torch.testing.assert_close(fused, explicit, atol=1e-4, rtol=1e-4)  # TF32 matmuls may be on
    explicit_causal = mha(x, mask=causal_mask(33, device=device), need_weights=True)[0]
    torch.testing.assert_close(causal_fused, explicit_causal, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ from torch, head_dim


@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_equals_torch_multihead_attention(bias):
    ref = nn.MultiheadAttention(24, 3, bias=bias, batch_first=True).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_()
    ours = MultiHeadAttention.from_torch(ref).eval()
    x, ctx = torch.randn(2, 5, 24), torch.randn(2, 7, 24)
    torch.testing.assert_close(ours(x)[0], ref(x, x, x, need_weights=False)[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours(x, context=ctx)[0], ref(x, ctx, ctx, need_weights=False)[0], atol=1e-4, rtol=1e-4)
    ref_mask = ~causal_mask(5)  # torch: True = may NOT attend
    torch.testing.assert_close(ours(x, causal=True)[0], ref(x, x, x, attn_mask=ref_mask, need_weights=False)[0],
                               atol=1e-4, rtol=1e-4)
    with pytest.raises(TypeError, match="module must be a torch.nn.MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="kdim == vdim == embed_dim"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))


def test_head_dim_can_differ_from_d_model_over_heads():
    mha = MultiHeadAttention(16, 4, head_dim=8).eval()  # T5-style: inner width 4 * 8 = 32 != 16
    assert mha.in_proj.weight.shape == (3 * 32, 16) and mha.out_proj.weight.shape == (16, 32)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(mha(x, causal=True)[0], mha(x, causal=True, need_weights=True)[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="head_dim must be an int >= 1"):
        MultiHeadAttention(16, 4, head_dim=0)


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_a_sliding_window_layer_runs_the_local_kernel_equal_to_the_dense_mask(n_kv_heads):
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads, sliding_window=5).eval()
    x = torch.randn(2, 23, 32)
    out, _ = mha(x, causal=True)  # the chunked local kernel
    ref, weights = mha(x, causal=True, need_weights=True)  # the explicit path, with the dense mask
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    assert torch.equal(weights[0, 0] > 0, sliding_window_mask(23, window=4))  # query p sees keys p-4 ... p
    short, _ = mha(x[:, :5], causal=True)  # no longer than the window: plain causal attention
    torch.testing.assert_close(short, ref[:, :5], atol=1e-5, rtol=0)


def test_a_sliding_window_layer_saves_memory_linear_in_the_length():
    from companion.profiling import saved_tensor_bytes

    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, sliding_window=8)

    def saved(length: int, **kwargs) -> int:
        x = torch.randn(1, length, 16, requires_grad=True)
        return saved_tensor_bytes(lambda: mha(x, causal=True, **kwargs)[0].sum())

    local = saved(1024) / saved(512)
    dense = saved(1024, need_weights=True) / saved(512, need_weights=True)
    assert local < 2.2 < 3.5 < dense  # O(L · window) against O(L²)
