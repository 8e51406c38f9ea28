"""Scaled dot-product attention, written out (:func:`scaled_dot_product_attention`) and fused
(:func:`fused_attention`), under one set of conventions.

Both compute Vaswani et al. (2017), eq. 1::

    Attention(Q, K, V) = softmax(Q Kᵀ · scale + bias + M) V,    scale = 1/√head_dim by default

* ``mask`` is **boolean, True = may attend**, broadcastable to ``(batch, heads, q_len, k_len)``
  (build it with :mod:`companion.attention.masks`); masked scores get −∞, i.e. the additive
  matrix M has entries 0 or −∞. A query whose every key is masked gets an output of zeros (and
  zero weights), never NaN, on both paths.
* ``bias`` is an additive float bias on the scores (ALiBi, T5's relative buckets), broadcastable
  to the same shape.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from companion.attention._checks import check_mask_and_bias, check_probability, check_qkv, check_scale

__all__ = ["scaled_dot_product_attention", "fused_attention"]


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
    *,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention written out: ``softmax(q kᵀ · scale + bias + M) v`` (Vaswani et al., 2017, eq. 1).

    Args:
        q: queries, ``(batch, heads, q_len, head_dim)`` (any number of leading dims works).
        k: keys, ``(batch, heads, k_len, head_dim)``.
        v: values, ``(batch, heads, k_len, d_v)``.
        mask: optional bool tensor broadcastable to ``(batch, heads, q_len, k_len)``;
            True = the query may attend to that key. Masked scores become −∞ so their weight is
            exactly zero.
        bias: optional additive float tensor broadcastable to ``(batch, heads, q_len, k_len)``,
            added to the scaled scores (ALiBi's linear penalties, T5's relative-position buckets).
        dropout_p: probability of zeroing an attention weight (applied whenever > 0; pass 0.0 at
            evaluation). The survivors are scaled by ``1 / (1 - dropout_p)``.
        scale: the factor on ``q kᵀ``; default ``1 / sqrt(head_dim)``.

    Returns:
        ``(output, weights)``: output ``(batch, heads, q_len, d_v)`` and the attention weights
        ``(batch, heads, q_len, k_len)`` before dropout (each row sums to 1). A query with no
        allowed key gets an all-zero row in both, never NaN. Autograd keeps one
        ``(q_len, k_len)`` weight matrix per head for the backward pass.
    """
    scores_shape = check_qkv(q, k, v)
    check_mask_and_bias(mask, bias, scores_shape)
    check_probability("dropout_p", dropout_p)
    check_scale(scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale

    scores = (q @ k.transpose(-2, -1)) * scale  # (batch, heads, q_len, k_len): every query · every key
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    row_ok = None
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
        # A row of all -inf would give softmax 0/0 = NaN (and NaN gradients). Give such rows
        # finite scores, then zero their output.
        row_ok = mask.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~row_ok, 0.0)
    # Softmax in at least float32 even under bf16/fp16 autocast: exp overflows in half precision.
    acc = torch.promote_types(scores.dtype, torch.float32)
    weights = torch.softmax(scores, dim=-1, dtype=acc).to(v.dtype)
    attn = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    out = attn @ v
    if row_ok is not None:
        # Zero the rows that had no allowed key on the (q_len, d_v) output, not on the
        # (q_len, k_len) weights: a masked copy of the weights would be a second L x L matrix
        # kept for the backward pass. The copy returned for inspection is not on that path.
        out, weights = out * row_ok, weights * row_ok
    return out, weights


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
    *,
    scale: float | None = None,
    is_causal: bool = False,
) -> Tensor:
    """The output of :func:`scaled_dot_product_attention`, from PyTorch's fused kernel.

    Same arguments and conventions (bool ``mask``, True = may attend; additive ``bias``; a query
    with no allowed key returns zeros), but only the output ``(batch, heads, q_len, d_v)`` is
    returned: ``torch.nn.functional.scaled_dot_product_attention`` picks a FlashAttention-style
    kernel that computes the softmax block by block and never stores the ``(q_len, k_len)``
    weights, which is what makes it fast and O(L) in memory (Dao et al., 2022) — as long as no
    ``(q_len, k_len)`` mask or bias tensor is passed in, since that tensor is itself L × L (use
    ``is_causal`` for the causal mask).

    ``is_causal=True`` (only with ``mask=None``, ``bias=None`` and ``q_len == k_len``) asks the
    kernel to apply the causal mask itself, which lets it skip the masked blocks.
    """
    scores_shape = check_qkv(q, k, v)
    check_mask_and_bias(mask, bias, scores_shape)
    check_probability("dropout_p", dropout_p)
    check_scale(scale)
    if is_causal and (mask is not None or bias is not None or q.shape[-2] != k.shape[-2]):
        raise ValueError(
            "is_causal=True needs mask=None, bias=None and q_len == k_len; got "
            f"mask={'a tensor' if mask is not None else None}, bias={'a tensor' if bias is not None else None}, "
            f"q_len={q.shape[-2]}, k_len={k.shape[-2]} (pass causal_mask(q_len, k_len) as mask instead)"
        )
    return _sdpa(q, k, v, mask, bias, dropout_p, scale, is_causal)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None, dropout_p: float,
          scale: float | None, is_causal: bool, enable_gqa: bool = False) -> Tensor:
    """:func:`fused_attention` without the checks (for callers that validated their inputs).

    ``enable_gqa``: ``k`` and ``v`` have ``heads / group`` heads, query head ``i`` reading key/value
    head ``i // group``. PyTorch's CPU kernel and its CUDA FlashAttention kernel then read the shared
    heads without copying them; its CUDA math fallback repeats them (and builds the scores).
    """
    row_ok = None
    if mask is not None:
        # Same guard as the explicit path: let an all-masked row attend everywhere, then zero it,
        # so no kernel ever sees a row of -inf (NaN on some backends, NaN gradients on others).
        row_ok = mask.any(dim=-1, keepdim=True)
        mask = mask | ~row_ok
    attn_mask = mask
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        if mask is not None:
            attn_mask = attn_mask.masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                         scale=scale, enable_gqa=enable_gqa)
    if row_ok is not None:
        out = out * row_ok
    return out
