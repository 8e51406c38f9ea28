"""Attention: scaled dot-product attention, masks, multi-head attention (MHA, GQA, MQA) and a KV cache.

The whole package is one equation (Vaswani et al., 2017, eq. 1) and the plumbing around it::

    Attention(Q, K, V) = softmax(Q Kᵀ / √head_dim + M) V

* :mod:`~companion.attention.functional` — :func:`scaled_dot_product_attention` writes the
  equation out and returns the weights too; :func:`fused_attention` computes the same output with
  PyTorch's fused kernels (FlashAttention-style: the ``(q_len, k_len)`` weights are never stored).
* :mod:`~companion.attention.masks` — boolean masks, **True = may attend**, broadcastable to
  ``(batch, heads, q_len, k_len)``: :func:`causal_mask`, :func:`padding_mask`,
  :func:`sliding_window_mask`, :func:`combine_masks`, :func:`mask_to_bias`.
* :mod:`~companion.attention.kv_cache` — :class:`KVCache`, preallocated keys and values for
  generation, :class:`StaticKVCache`, the same with fixed shapes for a compiled step, and
  :func:`kv_cache_bytes`.
* :mod:`~companion.attention.multi_head` — :class:`MultiHeadAttention`: projections, heads,
  grouped-query and multi-query attention, the cache, the rotary hook, a sliding window.

For long sequences (Chapter 14), each checked against the dense equation:

* :mod:`~companion.attention.tiled` — :func:`tiled_attention`, exact attention block by block with
  the online softmax (the FlashAttention algorithm), O(L) memory for the backward pass.
* :mod:`~companion.attention.local` — :func:`sliding_window_attention`, local attention in O(L·window)
  memory, and :func:`global_local_attention`, Longformer's local window plus global tokens.
* :mod:`~companion.attention.rolling_cache` — :class:`RollingKVCache`, a ring of ``window + 1`` slots
  for sliding-window decoding (memory O(window)).
* :mod:`~companion.attention.linformer` — :class:`LinformerAttention`, keys and values projected to
  ``k`` rows along the sequence.
* :mod:`~companion.attention.performer` — :func:`performer_attention` with FAVOR+ random features
  (:func:`favor_features`, :func:`orthogonal_random_features`).

Shapes use ``batch``, ``heads`` (query heads), ``kv_heads``, ``q_len``/``k_len`` (lengths of queries
and of keys/values) and ``head_dim`` (the per-head width, d_k in the paper).
"""

from companion.attention.functional import fused_attention, scaled_dot_product_attention
from companion.attention.kv_cache import KVCache, StaticKVCache, kv_cache_bytes
from companion.attention.linformer import LinformerAttention
from companion.attention.local import global_local_attention, sliding_window_attention
from companion.attention.masks import causal_mask, combine_masks, mask_to_bias, padding_mask, sliding_window_mask
from companion.attention.multi_head import MultiHeadAttention
from companion.attention.performer import favor_features, orthogonal_random_features, performer_attention
from companion.attention.rolling_cache import RollingKVCache
from companion.attention.tiled import tiled_attention

__all__ = [
    "scaled_dot_product_attention",
    "fused_attention",
    "causal_mask",
    "padding_mask",
    "sliding_window_mask",
    "combine_masks",
    "mask_to_bias",
    "MultiHeadAttention",
    "KVCache",
    "StaticKVCache",
    "kv_cache_bytes",
    "tiled_attention",
    "sliding_window_attention",
    "global_local_attention",
    "RollingKVCache",
    "LinformerAttention",
    "performer_attention",
    "favor_features",
    "orthogonal_random_features",
]
