"""Tiled exact attention: the FlashAttention algorithm, written in plain PyTorch.

Explicit attention builds the ``(q_len, k_len)`` score matrix, softmaxes it and keeps it for the
backward pass: O(L²) memory. The softmax of a row, though, can be computed a block of keys at a
time (the *online softmax*, Milakov & Gimelshein, 2018). Keep, for each query row, the running
maximum ``m``, the running sum ``ℓ`` of ``exp(s - m)`` and the unnormalised output ``o``; for the
next block of scores ``s``::

    m_new = max(m, rowmax(s))
    ℓ     = exp(m - m_new) · ℓ + rowsum(exp(s - m_new))
    o     = exp(m - m_new) · o + exp(s - m_new) V_block
    m     = m_new

and after the last block ``output = o / ℓ``: exactly softmax(Q Kᵀ · scale) V, never holding more
than a ``(block_size, block_size)`` tile of scores. That is Algorithm 1 of FlashAttention (Dao et
al., 2022). With ``causal=True`` the key blocks wholly above the diagonal are never visited, which
skips about half the arithmetic.

The backward pass (Algorithm 2) *recomputes* each tile instead of storing it. The forward saves
only q, k, v, the output O and one number per row, the log-sum-exp ``L = m + log ℓ``, from which a
tile's probabilities come back as ``P = exp(S - L)``. With ``D = rowsum(dO ∘ O)``::

    dV += Pᵀ dO      dP = dO Vᵀ      dS = P ∘ (dP - D)      dQ += dS K · scale      dK += dSᵀ Q · scale

so the memory kept for backward is O(L) per head rather than O(L²). The GPU kernels do the same to
stay in fast on-chip memory; here the loops are Python loops, so this module shows the algorithm,
and :func:`~companion.attention.fused_attention` is the one to run for speed.

Example::

    >>> import torch.nn.functional as F
    >>> q, k, v = (torch.randn(2, 4, 100, 16) for _ in range(3))
    >>> out = tiled_attention(q, k, v, causal=True, block_size=32)   # (2, 4, 100, 16)
    >>> ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> torch.allclose(out, ref, atol=1e-5)
    True
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from companion.attention._checks import check_length, check_qkv, check_scale

__all__ = ["tiled_attention"]


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, scale: float | None = None,
                    block_size: int = 64) -> Tensor:
    """Exact ``softmax(q kᵀ · scale) v``, computed block by block with the online softmax (Dao et al., 2022).

    Args:
        q: queries, ``(batch, heads, q_len, head_dim)`` (any number of leading dims works).
        k: keys, ``(batch, heads, k_len, head_dim)``, with the same leading dims as ``q``.
        v: values, ``(batch, heads, k_len, d_v)``.
        causal: query ``i`` sees keys ``j <= i + k_len - q_len`` (the queries are the last
            ``q_len`` of the ``k_len`` positions, as in :func:`~companion.attention.causal_mask`);
            needs ``k_len >= q_len``. Key blocks that no query of a block may see are skipped.
        scale: the factor on ``q kᵀ``; default ``1 / sqrt(head_dim)``.
        block_size: rows of queries and of keys per tile; lengths need not be multiples of it.

    Returns:
        ``(batch, heads, q_len, d_v)``, equal to :func:`~companion.attention.scaled_dot_product_attention`'s
        output up to rounding. Autograd keeps q, k, v, the output and one float per query row;
        the backward pass recomputes the attention weights tile by tile.
    """
    check_qkv(q, k, v)
    check_scale(scale)
    block_size = check_length("block_size", block_size)
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"q, k and v must have the same leading (batch, heads) dims, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    q_len, k_len = q.shape[-2], k.shape[-2]
    if k_len == 0 or (causal and k_len < q_len):
        raise ValueError(f"tiled_attention needs k_len >= 1, and k_len >= q_len when causal (else a query would "
                         f"see no key); got q_len={q_len}, k_len={k_len}, causal={causal}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _TiledAttention.apply(q, k, v, bool(causal), scale, block_size)


def _tiles(q_len: int, k_len: int, block: int, causal: bool):
    """Yield ``(i0, i1, j0, j1)``: the query rows and key columns of every tile that is not fully masked."""
    offset = k_len - q_len  # keys before the first query (the cached past)
    for i0 in range(0, q_len, block):
        i1 = min(i0 + block, q_len)
        # the last query of the block, at position i1 - 1 + offset, sees keys up to that position
        k_end = min(k_len, i1 + offset) if causal else k_len
        for j0 in range(0, k_end, block):
            yield i0, i1, j0, min(j0 + block, k_len)


def _scores(q: Tensor, k: Tensor, scale: float, causal: bool, i0: int, i1: int, j0: int, j1: int,
            offset: int, acc: torch.dtype) -> Tensor:
    """The ``(..., i1 - i0, j1 - j0)`` tile of scaled scores, in ``acc``, −∞ where the causal mask hides a key."""
    s = (q[..., i0:i1, :].to(acc) @ k[..., j0:j1, :].to(acc).transpose(-2, -1)) * scale
    if causal and j1 - 1 > i0 + offset:  # the tile crosses the diagonal (a shape test: no host sync)
        rows = torch.arange(i0, i1, device=q.device).unsqueeze(1) + offset
        cols = torch.arange(j0, j1, device=q.device).unsqueeze(0)
        s = s.masked_fill(cols > rows, float("-inf"))
    return s


class _TiledAttention(torch.autograd.Function):
    """Forward: Algorithm 1 (online softmax). Backward: Algorithm 2 (recompute each tile from L)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, block: int) -> Tensor:
        acc = torch.promote_types(q.dtype, torch.float32)  # accumulate in at least float32
        *batch, q_len, _ = q.shape
        k_len, d_v = k.shape[-2], v.shape[-1]
        offset = k_len - q_len
        # running statistics of every query row: max m, sum ℓ, unnormalised output o
        m = torch.full((*batch, q_len, 1), float("-inf"), device=q.device, dtype=acc)
        l = torch.zeros((*batch, q_len, 1), device=q.device, dtype=acc)  # noqa: E741 (ℓ of the paper)
        o = torch.zeros((*batch, q_len, d_v), device=q.device, dtype=acc)
        for i0, i1, j0, j1 in _tiles(q_len, k_len, block, causal):
            s = _scores(q, k, scale, causal, i0, i1, j0, j1, offset, acc)
            m_old = m[..., i0:i1, :]
            m_new = torch.maximum(m_old, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)  # this tile's unnormalised probabilities
            rescale = torch.exp(m_old - m_new)  # what the old sums were measured against, now smaller
            l[..., i0:i1, :] = rescale * l[..., i0:i1, :] + p.sum(dim=-1, keepdim=True)
            o[..., i0:i1, :] = rescale * o[..., i0:i1, :] + p @ v[..., j0:j1, :].to(acc)
            m[..., i0:i1, :] = m_new
        out = (o / l).to(q.dtype)
        lse = m + torch.log(l)  # (..., q_len, 1): all that backward needs to rebuild the softmax
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.block = causal, scale, block
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale, block = ctx.causal, ctx.scale, ctx.block
        acc = lse.dtype
        q_len, k_len = q.shape[-2], k.shape[-2]
        offset = k_len - q_len
        d_out = d_out.to(acc)
        D = (d_out * out.to(acc)).sum(dim=-1, keepdim=True)  # (..., q_len, 1): rowsum(dO ∘ O)
        dq = torch.zeros(q.shape, device=q.device, dtype=acc)
        dk = torch.zeros(k.shape, device=k.device, dtype=acc)
        dv = torch.zeros(v.shape, device=v.device, dtype=acc)
        for i0, i1, j0, j1 in _tiles(q_len, k_len, block, causal):
            s = _scores(q, k, scale, causal, i0, i1, j0, j1, offset, acc)
            p = torch.exp(s - lse[..., i0:i1, :])  # the softmax tile, recomputed (0 where masked)
            d_o = d_out[..., i0:i1, :]
            dv[..., j0:j1, :] += p.transpose(-2, -1) @ d_o
            dp = d_o @ v[..., j0:j1, :].to(acc).transpose(-2, -1)
            ds = p * (dp - D[..., i0:i1, :])
            dq[..., i0:i1, :] += ds @ k[..., j0:j1, :].to(acc) * scale
            dk[..., j0:j1, :] += ds.transpose(-2, -1) @ q[..., i0:i1, :].to(acc) * scale
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None
