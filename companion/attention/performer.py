"""Performer (FAVOR+): softmax attention in O(L·m·head_dim) with positive random features
(Choromanski et al., 2021).

Softmax attention is a kernel smoother: output_i = Σ_j K(q_i, k_j) v_j / Σ_j K(q_i, k_j) with the
softmax kernel ``K(q, k) = exp(q·k / √head_dim)``. If the kernel were an inner product of feature
maps, ``K(q, k) ≈ φ(q)·φ(k)``, the sums could be regrouped::

    output = φ(Q) (φ(K)ᵀ V) / φ(Q) (φ(K)ᵀ 1)      # (L, m) @ (m, head_dim): no (L, L) matrix

which costs O(L·m·head_dim) instead of O(L²·head_dim). FAVOR+ finds such a φ. For ω ~ N(0, I)
(Choromanski et al., 2021, Lemma 1)::

    exp(x·y) = E_ω[ exp(ω·x − |x|²/2) · exp(ω·y − |y|²/2) ]

so with m draws ω_1 … ω_m (the rows of ``projection``, ``(m, head_dim)``),
``φ(x) = exp(ω_r·x − |x|²/2)_r / √m`` gives an *unbiased* estimate ``φ(x)·φ(y)`` of exp(x·y).
Applied to ``x = q / head_dim^{1/4}`` and ``y = k / head_dim^{1/4}`` it estimates the softmax kernel.
The features are **positive** ("+"), unlike sin/cos random Fourier features, so the estimated
normaliser never goes negative or near zero. The rows are drawn in **orthogonal** blocks
("O", :func:`orthogonal_random_features`), which lowers the variance of the estimate.

Numerical stability: ``exp`` overflows for large ``ω·x``. Subtracting a constant ``c`` from the
exponent multiplies features by e^{-c}. For a query that factor appears in both the numerator and the
denominator of its own row, so each query may use its own ``c`` (its row maximum). For keys it must
be one constant shared by **every key of the attention** (here: the maximum over the whole
``(seq, m)`` slice of each batch and head): a per-key constant would reweight the keys against each
other and bias the result. (The ratio output is a consistent, not an unbiased, estimate of softmax
attention; only the kernel estimate is unbiased.)

Causal attention (a decoder) needs, for query i, sums over keys j <= i only: prefix sums over the
sequence of ``φ(k_j) ⊗ v_j`` and ``φ(k_j)`` (Choromanski et al., 2021). This teaching version
keeps all L prefix sums, ``(L, m, head_dim)`` per head: O(L·m·head_dim) memory. Usage::

    proj = orthogonal_random_features(256, head_dim=64)            # (m, head_dim), redraw now and then
    out = performer_attention(q, k, v, proj, causal=True)          # q, k, v (batch, heads, seq, 64)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from companion._validation import check_choice
from companion.attention._checks import check_length, check_qkv, check_tensor

__all__ = ["favor_features", "orthogonal_random_features", "performer_attention"]

_STABILIZERS = ("none", "query", "key")


def _check_projection(projection: object, head_dim: int) -> Tensor:
    check_tensor("projection", projection)
    if projection.dim() != 2 or projection.shape[1] != head_dim:  # type: ignore[union-attr]
        raise ValueError(f"projection must have shape (m, head_dim={head_dim}), "
                         f"got {tuple(projection.shape)}")  # type: ignore[union-attr]
    return projection  # type: ignore[return-value]


def favor_features(x: Tensor, projection: Tensor, *, stabilizer: str = "none") -> Tensor:
    """Positive random features ``φ(x) = exp(ω·x − |x|²/2) / √m`` of FAVOR+ (Choromanski et al., 2021).

    Args:
        x: ``(..., seq, head_dim)``, e.g. queries or keys already divided by ``head_dim ** 0.25``.
        projection: ``(m, head_dim)``, the random directions ω as rows
            (:func:`orthogonal_random_features`, or ``torch.randn(m, head_dim)`` for iid ones).
        stabilizer: what to subtract from the exponent before ``exp`` (detached from autograd):

            * ``"none"`` — nothing: ``φ(x)·φ(y)`` is an unbiased estimate of ``exp(x·y)``;
            * ``"query"`` — each row's maximum (a per-query factor, cancelled by that query's
              normaliser);
            * ``"key"`` — the maximum over each ``(seq, m)`` slice, one constant per batch and
              head shared by all keys, so every kernel estimate is scaled by the same factor,
              which the normaliser cancels. Never a per-key constant: that would bias attention.

    Returns:
        ``(..., seq, m)``, positive, in ``x``'s dtype promoted to at least float32.
    """
    check_tensor("x", x, 2)
    projection = _check_projection(projection, x.shape[-1])
    check_choice("stabilizer", stabilizer, _STABILIZERS)
    acc = torch.promote_types(x.dtype, torch.float32)  # exp in half precision overflows
    x = x.to(acc)
    logits = x @ projection.to(device=x.device, dtype=acc).T  # (..., seq, m): ω_r · x
    logits = logits - (x * x).sum(-1, keepdim=True) / 2  # − |x|² / 2
    if stabilizer == "query":
        logits = logits - logits.amax(dim=-1, keepdim=True).detach()
    elif stabilizer == "key":
        logits = logits - logits.amax(dim=(-2, -1), keepdim=True).detach()
    return torch.exp(logits) / math.sqrt(projection.shape[0])


def orthogonal_random_features(m: int, head_dim: int, *, generator: torch.Generator | None = None,
                               device: torch.device | str | None = None, dtype: torch.dtype | None = None
                               ) -> Tensor:
    """``m`` random directions ``(m, head_dim)``, orthogonal within blocks of ``head_dim`` rows.

    Each block is the orthogonal factor of the QR decomposition of a Gaussian ``(head_dim,
    head_dim)`` matrix (signs fixed by R's diagonal, so it is uniformly distributed); the blocks are
    stacked and cut to ``m`` rows. Each row is then rescaled to the norm of an independent
    Gaussian vector (chi-distributed with ``head_dim`` degrees of freedom), so every row is still
    marginally ω ~ N(0, I) — the estimate stays unbiased — while rows in one block are exactly
    orthogonal, which lowers its variance (Choromanski et al., 2021: orthogonal random features).

    Args:
        m: number of features (rows), ``>= 1``.
        head_dim: width of queries and keys.
        generator: optional ``torch.Generator`` for reproducible draws; sampling happens on its
            device (the CPU by default), then the result moves to ``device``.
        device, dtype: of the result (default: the CPU, the default dtype).
    """
    check_length("m", m)
    check_length("head_dim", head_dim)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating-point torch.dtype or None, got {dtype!r}")
    where = generator.device if generator is not None else torch.device("cpu")
    work = torch.float64 if where.type == "cpu" else torch.float32  # QR needs float32 or float64
    blocks = -(-m // head_dim)  # ceil(m / head_dim)
    gaussian = torch.randn(blocks, head_dim, head_dim, generator=generator, device=where, dtype=work)
    q, r = torch.linalg.qr(gaussian)  # q: (blocks, head_dim, head_dim), orthonormal columns
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # Haar-distributed
    rows = q.transpose(-2, -1).reshape(blocks * head_dim, head_dim)[:m]  # unit rows, orthogonal per block
    norms = torch.randn(m, head_dim, generator=generator, device=where, dtype=work).norm(dim=-1, keepdim=True)
    return (rows * norms).to(device=device, dtype=dtype or torch.get_default_dtype())


def performer_attention(q: Tensor, k: Tensor, v: Tensor, projection: Tensor, *, causal: bool = False) -> Tensor:
    """Softmax attention estimated with FAVOR+ features, in O(seq·m·head_dim) (Choromanski et al., 2021).

    Estimates ``softmax(q kᵀ / √head_dim) v`` (with the causal mask if ``causal``) through
    ``φ(q / head_dim^{1/4})`` and ``φ(k / head_dim^{1/4})`` (:func:`favor_features`); the error
    shrinks as the number of features ``m`` grows.

    Args:
        q: queries, ``(batch, heads, q_len, head_dim)`` (any number of leading dims works).
        k: keys, ``(batch, heads, k_len, head_dim)``.
        v: values, ``(batch, heads, k_len, d_v)``.
        projection: ``(m, head_dim)`` random directions (:func:`orthogonal_random_features`).
        causal: query i attends to keys ``j <= i`` only (needs ``q_len == k_len``): prefix sums
            of ``φ(k_j) ⊗ v_j`` over the sequence, ``(batch, heads, seq, m, d_v)`` in memory.
            Otherwise ``φ(K)ᵀ V``, ``(batch, heads, m, d_v)``, is formed once.

    Returns:
        ``(batch, heads, q_len, d_v)`` in ``v``'s dtype (computed in at least float32).
    """
    check_qkv(q, k, v)
    head_dim = q.shape[-1]
    _check_projection(projection, head_dim)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal=True needs q_len == k_len, got q of shape {tuple(q.shape)} and k of shape "
                         f"{tuple(k.shape)}")
    scale = head_dim ** -0.25  # φ(q/d^¼)·φ(k/d^¼) estimates exp(q·k/√d)
    phi_q = favor_features(q * scale, projection, stabilizer="query")  # (..., q_len, m)
    phi_k = favor_features(k * scale, projection, stabilizer="key")  # (..., k_len, m)
    v_acc = v.to(phi_k.dtype)
    if causal:
        kv = torch.cumsum(phi_k.unsqueeze(-1) * v_acc.unsqueeze(-2), dim=-3)  # (..., seq, m, d_v): Σ_{j<=i}
        num = (phi_q.unsqueeze(-2) @ kv).squeeze(-2)  # (..., seq, d_v)
        den = (phi_q * phi_k.cumsum(dim=-2)).sum(-1, keepdim=True)  # (..., seq, 1)
    else:
        num = phi_q @ (phi_k.transpose(-2, -1) @ v_acc)  # (q_len, m) @ (m, d_v)
        den = phi_q @ phi_k.sum(dim=-2).unsqueeze(-1)  # (..., q_len, 1)
    # The features are positive, so den > 0 unless every term underflowed; keep 0/0 out anyway.
    out = num / den.clamp_min(torch.finfo(den.dtype).tiny)
    return out.to(v.dtype)
