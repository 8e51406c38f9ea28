"""Tests for Linformer and Performer (FAVOR+): exact limits against dense attention, statistics of the
random-feature estimate, the causal prefix sums against their quadratic form, and every bad input."""

from __future__ import annotations

import math

import pytest
import torch

from companion.attention import MultiHeadAttention
from companion.attention.linformer import LinformerAttention
from companion.attention.performer import favor_features, orthogonal_random_features, performer_attention


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def dense_attention(q, k, v, causal=False):
    """Reference softmax attention in float64: softmax(q kᵀ / √head_dim [+ causal −∞]) v."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def rms(x):
    return x.pow(2).mean().sqrt().item()


# ------------------------------------------------------------------ Linformer


def test_linformer_shapes_weights_and_fused_path():
    attn = LinformerAttention(d_model=16, n_heads=4, max_len=12, k=5).eval()
    x = torch.randn(2, 10, 16)
    out, w = attn(x, need_weights=True)
    assert out.shape == (2, 10, 16) and w.shape == (2, 4, 10, 5)  # scores (batch, heads, seq, k)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 10))
    fused, none = attn(x)
    assert none is None
    torch.testing.assert_close(fused, out, atol=1e-6, rtol=1e-5)


def dense_mha_float64(attn, x):
    """Multi-head softmax attention with ``attn``'s in_proj/out_proj, written out in float64."""
    b, n, _ = x.shape
    h, d = attn.n_heads, attn.head_dim
    qkv = x.double() @ attn.in_proj.weight.double().T + attn.in_proj.bias.double()
    q, k, v = (t.view(b, n, h, d).transpose(1, 2) for t in qkv.split(attn.d_model, dim=-1))
    heads = dense_attention(q, k, v).transpose(1, 2).reshape(b, n, h * d)
    return heads @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


@pytest.mark.parametrize("seq, max_len", [(7, 7), (7, 12)])
def test_linformer_with_identity_projections_is_softmax_attention(seq, max_len):
    # k = seq and E[:, :seq] = F[:, :seq] = I: the projected keys are the keys. The columns past seq
    # are random: a shorter input must not touch them.
    attn = LinformerAttention(d_model=12, n_heads=3, max_len=max_len, k=seq).eval()
    with torch.no_grad():
        for p in (attn.E, attn.F):
            p.normal_()
            p[:, :seq] = torch.eye(seq)
        attn.in_proj.bias.normal_()
    x = torch.randn(2, seq, 12)
    out, _ = attn(x)
    torch.testing.assert_close(out.double(), dense_mha_float64(attn, x), atol=1e-5, rtol=1e-5)
    mha = MultiHeadAttention(12, 3).eval()
    mha.load_state_dict({n: p for n, p in attn.state_dict().items() if n not in ("E", "F")})
    torch.testing.assert_close(out, mha(x)[0], atol=1e-6, rtol=1e-5)


def test_linformer_projection_mixes_the_future_so_it_cannot_be_causal():
    attn = LinformerAttention(d_model=8, n_heads=2, max_len=6, k=3).eval()
    x = torch.randn(1, 6, 8)
    y = x.clone()
    y[:, -1] += 1.0  # change only the last token
    assert not torch.allclose(attn(x)[0][:, 0], attn(y)[0][:, 0])  # the first position sees it
    with pytest.raises(ValueError, match="non-causal"):
        attn(x, causal=True)


def test_linformer_rejects_sequences_longer_than_max_len():
    attn = LinformerAttention(d_model=8, n_heads=2, max_len=8, k=4)
    attn(torch.randn(1, 8, 8))  # exactly max_len is fine
    with pytest.raises(ValueError, match=r"seq=9.*max_len=8.*seq <= 8"):
        attn(torch.randn(1, 9, 8))


def test_linformer_gradients_reach_the_used_columns_of_E_and_F():
    attn = LinformerAttention(d_model=8, n_heads=2, max_len=10, k=3)
    attn(torch.randn(2, 6, 8))[0].pow(2).sum().backward()
    for p in (attn.E, attn.F):
        assert p.grad is not None and p.grad.shape == (3, 10)
        assert (p.grad[:, :6].abs() > 0).all()  # every used column learns
        assert (p.grad[:, 6:] == 0).all()  # columns for positions never seen get nothing

    small = LinformerAttention(d_model=4, n_heads=2, max_len=5, k=2).double()
    x = torch.randn(1, 4, 4, dtype=torch.float64)

    E = small.E.detach().clone().requires_grad_()
    F = small.F.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda E, F: torch.func.functional_call(small, {"E": E, "F": F}, (x,))[0],
                                    (E, F))


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=10, n_heads=3, max_len=8, k=4), "divisible"),
    (dict(d_model=8, n_heads=2, max_len=0, k=4), "max_len"),
    (dict(d_model=8, n_heads=2, max_len=8, k=0), "k must"),
    (dict(d_model=8, n_heads=2, max_len=8, k=4, dropout=1.0), "dropout"),
])
def test_linformer_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LinformerAttention(**kwargs)


def test_linformer_bad_input_shape():
    with pytest.raises(ValueError, match="d_model=8"):
        LinformerAttention(8, 2, max_len=8, k=4)(torch.randn(1, 5, 6))


def test_attention_of_smooth_sequences_is_close_to_low_rank():
    # Linformer's premise (Wang et al., 2020, §3): P = softmax(QKᵀ/√d) is well approximated at low rank
    # when queries and keys vary smoothly along the sequence; a sharp, near-diagonal P is not.
    L, d = 64, 16
    g = torch.Generator().manual_seed(0)
    pos = torch.arange(L, dtype=torch.float64)[:, None]
    freqs = torch.arange(1, 9, dtype=torch.float64) * math.pi / L
    smooth = torch.cat([torch.sin(pos * freqs), torch.cos(pos * freqs)], dim=-1)  # (L, 16)
    wq, wk = (torch.randn(16, d, generator=g, dtype=torch.float64) for _ in range(2))
    p_smooth = torch.softmax((smooth @ wq) @ (smooth @ wk).T / math.sqrt(d), dim=-1)
    x = 3 * torch.randn(L, d, generator=g, dtype=torch.float64)
    p_sharp = torch.softmax(x @ x.T / math.sqrt(d), dim=-1)  # each query mostly attends to itself

    def rank_k_error(p, k):  # relative Frobenius error of the best rank-k approximation (Eckart–Young)
        s = torch.linalg.svdvals(p)
        return (s[k:].pow(2).sum() / s.pow(2).sum()).sqrt().item()

    assert rank_k_error(p_smooth, L // 4) < 0.3 < 0.8 < rank_k_error(p_sharp, L // 4)
    assert rank_k_error(p_smooth, L // 2) < 0.05


# ------------------------------------------------------------------ Performer: the features


def grouped_features(x, projection, draws):
    """φ(x) for ``draws`` independent projections stacked in ``projection`` ``(draws * m, d)``:
    ``(draws, ..., m)``. One call instead of a Python loop; each group of m rows is one draw."""
    m = projection.shape[0] // draws
    phi = favor_features(x, projection) * math.sqrt(draws)  # favor_features divided by √(draws · m)
    return phi.unflatten(-1, (draws, m)).movedim(-2, 0)


@pytest.mark.parametrize("orthogonal", [True, False])
def test_favor_kernel_estimate_is_unbiased(orthogonal):
    d, m, draws = 8, 8, 4000
    g = torch.Generator().manual_seed(1)
    # q/d^¼, k/d^¼ of vectors with |q|, |k| ≈ √d / 2. Larger norms make the estimate heavy-tailed
    # (lognormal-like): its sample std then understates the spread and the 4σ bound fails too often.
    q = torch.randn(3, d, generator=g, dtype=torch.float64) / (2 * d**0.25)
    k = torch.randn(3, d, generator=g, dtype=torch.float64) / (2 * d**0.25)
    exact = (q * k).sum(-1).exp()  # the softmax kernel exp(q·k/√d) of the unscaled vectors
    if orthogonal:  # m = head_dim: each draw is one orthogonal block, independent of the others
        proj = orthogonal_random_features(draws * m, d, generator=g, dtype=torch.float64)
    else:
        proj = torch.randn(draws * m, d, generator=g, dtype=torch.float64)
    est = (grouped_features(q, proj, draws) * grouped_features(k, proj, draws)).sum(-1)  # (draws, 3)
    mean, std = est.mean(0), est.std(0)
    assert (std > 0).all()
    assert ((mean - exact).abs() < 4 * std / math.sqrt(draws)).all(), (mean, exact, std)


def test_stabilizers_scale_by_one_constant_per_query_row_or_per_head():
    q = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    proj = torch.randn(6, 4, dtype=torch.float64)
    plain = favor_features(q, proj)
    row = favor_features(q, proj, stabilizer="query") / plain  # (2, 3, 5, 6)
    head = favor_features(q, proj, stabilizer="key") / plain
    torch.testing.assert_close(row, row[..., :1].expand_as(row))  # constant along m in each row
    torch.testing.assert_close(head, head[..., :1, :1].expand_as(head))  # constant over (seq, m) per head
    assert not torch.allclose(head[0, 0], head[1, 2])  # ... but one per (batch, head)
    assert (favor_features(q, proj, stabilizer="query").amax(-1) <= 1 / math.sqrt(6) + 1e-12).all()


def test_orthogonal_random_features_blocks_norms_and_reproducibility():
    g = torch.Generator().manual_seed(0)
    w = orthogonal_random_features(20, 8, generator=g, dtype=torch.float64)  # 2.5 blocks of 8
    assert w.shape == (20, 8) and w.dtype == torch.float64
    unit = w / w.norm(dim=-1, keepdim=True)
    for block in (unit[:8], unit[8:16], unit[16:]):
        torch.testing.assert_close(block @ block.T, torch.eye(len(block), dtype=torch.float64))
    assert not torch.allclose(unit[:8] @ unit[8:16].T, torch.zeros(8, 8, dtype=torch.float64), atol=0.05)
    assert w.norm(dim=-1).std() > 0.1  # chi-distributed norms, not all √head_dim
    again = orthogonal_random_features(20, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(w, again)
    assert orthogonal_random_features(3, 4).dtype == torch.get_default_dtype()


def test_orthogonal_random_features_have_gaussian_second_moments():
    # marginally ω ~ N(0, I): E[ω ωᵀ] = I (what makes the estimate unbiased)
    w = orthogonal_random_features(16 * 2000, 16, generator=torch.Generator().manual_seed(0),
                                   dtype=torch.float64)
    torch.testing.assert_close(w.T @ w / len(w), torch.eye(16, dtype=torch.float64), atol=0.05, rtol=0)


# ------------------------------------------------------------------ Performer: attention


@pytest.mark.parametrize("causal", [False, True])
def test_performer_error_falls_as_features_grow(causal):
    b, h, L, d, draws = 1, 2, 32, 16, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, L, d, generator=g, dtype=torch.float64) for _ in range(3))
    q, k = q / 2, k / 2  # moderate scores: the regime where the estimate is useful
    exact = dense_attention(q, k, v, causal)
    errors = {}
    for m in (16, 64, 256):  # m is a multiple of head_dim: each draw is whole blocks, independent of the rest
        projections = orthogonal_random_features(draws * m, d, generator=g, dtype=torch.float64).split(m)
        errors[m] = sum(rms(performer_attention(q, k, v, p, causal=causal) - exact) for p in projections) / draws
    assert errors[16] > errors[64] > errors[256], errors
    assert errors[256] < 0.5 * errors[16], errors  # ~1/√m: a factor 4 from 16 to 256 in expectation


def quadratic_performer(q, k, v, projection, causal):
    """The same estimate written with the (L, L) matrix: A = φ(Q) φ(K)ᵀ, masked, row-normalised."""
    d = q.shape[-1]
    phi_q = favor_features(q.double() / d**0.25, projection.double())
    phi_k = favor_features(k.double() / d**0.25, projection.double())
    a = phi_q @ phi_k.transpose(-2, -1)
    if causal:
        a = a * torch.ones(a.shape[-2:], dtype=torch.bool).tril()
    return (a / a.sum(-1, keepdim=True)) @ v.double()


@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("causal, q_len, k_len", [(True, 13, 13), (False, 13, 13), (False, 5, 11)])
def test_performer_equals_its_quadratic_form(dtype, atol, causal, q_len, k_len):
    q = torch.randn(2, 3, q_len, 8, dtype=dtype)
    k, v = torch.randn(2, 3, k_len, 8, dtype=dtype), torch.randn(2, 3, k_len, 6, dtype=dtype)
    proj = orthogonal_random_features(20, 8, dtype=dtype)
    out = performer_attention(q, k, v, proj, causal=causal)
    assert out.shape == (2, 3, q_len, 6) and out.dtype == dtype
    torch.testing.assert_close(out.double(), quadratic_performer(q, k, v, proj, causal), atol=atol, rtol=atol)


def test_causal_performer_ignores_the_future():
    q, k, v = (torch.randn(1, 2, 10, 8, dtype=torch.float64) for _ in range(3))
    proj = orthogonal_random_features(16, 8, dtype=torch.float64)
    out = performer_attention(q, k, v, proj, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 6:] += torch.randn(1, 2, 4, 8, dtype=torch.float64)
    v2[:, :, 6:] += 1.0
    out2 = performer_attention(q, k2, v2, proj, causal=True)
    torch.testing.assert_close(out2[:, :, :6], out[:, :, :6], atol=1e-12, rtol=1e-12)
    assert not torch.allclose(out2[:, :, 6:], out[:, :, 6:])


@pytest.mark.parametrize("causal", [False, True])
def test_performer_gradcheck(causal):
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    proj = orthogonal_random_features(6, 4, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda q, k, v: performer_attention(q, k, v, proj, causal=causal), (q, k, v))


def test_performer_half_precision_is_finite_and_close_to_float32():
    q, k, v = (torch.randn(1, 2, 16, 8) * 3 for _ in range(3))  # large scores: exp would overflow in bf16
    proj = orthogonal_random_features(32, 8)
    ref = performer_attention(q, k, v, proj, causal=True)
    out = performer_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), proj, causal=True)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=0.15, rtol=0.05)


def test_performer_bad_arguments():
    q = k = v = torch.randn(1, 2, 5, 8)
    proj = orthogonal_random_features(16, 8)
    with pytest.raises(ValueError, match=r"projection must have shape \(m, head_dim=8\)"):
        performer_attention(q, k, v, torch.randn(16, 4))
    with pytest.raises(ValueError, match="projection"):
        performer_attention(q, k, v, torch.randn(2, 16, 8))
    with pytest.raises(ValueError, match="q_len == k_len"):
        performer_attention(q[:, :, :3], k, v, proj, causal=True)
    with pytest.raises(ValueError, match="causal must be a bool"):
        performer_attention(q, k, v, proj, causal="yes")
    with pytest.raises(ValueError, match="same length"):
        performer_attention(q, k, v[:, :, :4], proj)
    with pytest.raises(ValueError, match="stabilizer"):
        favor_features(q, proj, stabilizer="row")
    with pytest.raises(ValueError, match="head_dim=8"):
        favor_features(q, torch.randn(16, 7))
    with pytest.raises(ValueError, match="m must be an int >= 1"):
        orthogonal_random_features(0, 8)
    with pytest.raises(ValueError, match="head_dim must be an int >= 1"):
        orthogonal_random_features(4, 0)
    with pytest.raises(ValueError, match="dtype"):
        orthogonal_random_features(4, 4, dtype=torch.int64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    q, k, v = (torch.randn(2, 2, 12, 8) for _ in range(3))
    proj = orthogonal_random_features(32, 8)
    for causal in (False, True):
        cpu = performer_attention(q, k, v, proj, causal=causal)
        gpu = performer_attention(q.cuda(), k.cuda(), v.cuda(), proj.cuda(), causal=causal)
        assert gpu.device.type == "cuda"
        torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-5, rtol=1e-4)
    attn = LinformerAttention(8, 2, max_len=12, k=4).eval()
    x = torch.randn(2, 10, 8)
    torch.testing.assert_close(attn.cuda()(x.cuda())[0].cpu(), attn.cpu()(x)[0], atol=1e-5, rtol=1e-4)
