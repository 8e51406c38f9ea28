"""Local attention that is really local: a chunked sliding window, and Longformer's global tokens.

:func:`~companion.attention.masks.sliding_window_mask` lets each query see only the keys at most
``window`` positions away, but as a dense ``(L, L)`` mask it still computes, and stores, all L²
scores: the cost it promises to save is spent anyway. :func:`sliding_window_attention` computes
the same output without ever building an ``(L, L)`` tensor. It cuts the sequence into chunks of
``chunk_size >= window`` positions. A query in chunk ``i`` can reach keys in chunk ``i`` and chunk
``i - 1`` only (causal), or chunks ``i - 1 … i + 1`` (symmetric), so each chunk of queries is
scored against a block of 2 or 3 chunks of keys, cut from the padded keys with a strided view
(``unfold``). Scores, weights and the chunked keys are ``(L / chunk) · chunk · 3 chunk`` numbers:
O(L · window) memory and arithmetic instead of O(L²). Within each block a small mask keeps exactly
the band ``|p - j| <= window`` (``0 <= p - j <= window`` when causal) and drops the padding::

    Attention(Q, K, V)_p = softmax_j( q_p · k_j · scale + M_pj ) v_j,   M_pj = 0 if j is in p's window else −∞

:func:`global_local_attention` adds Longformer's *global* tokens (Beltagy et al., 2020, §3.1): a
few positions (a ``[CLS]`` token, the question in QA) that attend to every position and that every
position attends to. Each ordinary query scores its local block and the ``g`` global keys — an
``(L, g)`` block — and one softmax runs over the two blocks joined (a global key already in the
query's window is counted once, in the local block). The ``g`` global queries are computed
densely, ``(g, L)``. Memory: O(L · (window + g)).

Example::

    >>> q = k = v = torch.randn(1, 2, 1000, 16)                                      # (batch, heads, seq, head_dim)
    >>> out = sliding_window_attention(q, k, v, window=32)                            # causal, like Mistral
    >>> out = global_local_attention(q, k, v, window=32, global_positions=[0])        # Longformer: [CLS] is global
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from companion._validation import tracing
from companion.attention._checks import check_length, check_qkv, check_scale

__all__ = ["sliding_window_attention", "global_local_attention"]


def _check_self_attention(q: Tensor, k: Tensor, v: Tensor, window: object, scale: object,
                          causal: object) -> tuple[Tensor, Tensor, Tensor]:
    """Validate the shared arguments; return q, k, v expanded to their common ``(*batch, seq, ·)`` shape."""
    shape = check_qkv(q, k, v)
    if shape[-2] != shape[-1]:
        raise ValueError(f"local attention is self-attention: q and k must have the same length (dim -2), "
                         f"got q {tuple(q.shape)} and k {tuple(k.shape)}")
    check_length("window", window, minimum=0)
    check_scale(scale)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    batch = shape[:-2]
    return tuple(t.expand(*batch, *t.shape[-2:]) for t in (q, k, v))  # type: ignore[return-value]


def _chunk_size(chunk_size: object, window: int, seq: int) -> int:
    """The chunk length: ``chunk_size`` (default ``window``), at least the reach ``min(window, seq - 1)``."""
    reach = min(window, seq - 1)  # the farthest key any query can see
    if chunk_size is None:
        return max(reach, 1)
    check_length("chunk_size", chunk_size)
    if chunk_size < reach:
        raise ValueError(f"chunk_size must be >= window={window} (a query must reach its keys in the "
                         f"neighbouring chunk), got {chunk_size}")
    return min(chunk_size, seq)


def _local_scores(q: Tensor, k: Tensor, v: Tensor, window: int, causal: bool, chunk: int,
                  scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """Scores of each chunk of queries against its block of keys, masked to the window.

    Returns ``scores`` ``(*batch, n, chunk, span)`` (−∞ outside the window), the value blocks
    ``(*batch, n, span, d_v)`` and the padded query chunks ``(*batch, n, chunk, head_dim)``, where
    ``n = ceil(seq / chunk)`` and ``span`` is 2 chunks (causal) or 3 (symmetric).
    """
    seq = q.shape[-2]
    n = -(-seq // chunk)
    pad = n * chunk - seq  # queries and keys past the end, to fill the last chunk
    ahead = 0 if causal else chunk  # the symmetric window also reaches into the next chunk
    span = 2 * chunk + ahead
    qc = F.pad(q, (0, 0, 0, pad)).unflatten(-2, (n, chunk))  # (*batch, n, chunk, head_dim)
    # One chunk of padding in front, so block i (padded positions i·chunk … i·chunk + span) starts
    # one chunk before query chunk i. unfold is a strided view: block i, key s = padded key i·chunk + s.
    kb = F.pad(k, (0, 0, chunk, pad + ahead)).unfold(-2, span, chunk).transpose(-1, -2)  # (*batch, n, span, d)
    vb = F.pad(v, (0, 0, chunk, pad + ahead)).unfold(-2, span, chunk).transpose(-1, -2)  # (*batch, n, span, d_v)
    scores = (qc @ kb.transpose(-1, -2)) * scale  # (*batch, n, chunk, span): O(seq · span), never (seq, seq)

    # Query r of chunk i is at position i·chunk + r, key s of its block at i·chunk − chunk + s:
    # their distance r − s + chunk is the same in every chunk, so the band is one (chunk, span) mask.
    r = torch.arange(chunk, device=q.device)[:, None]
    s = torch.arange(span, device=q.device)[None, :]
    dist = r - s + chunk
    band = (dist >= 0) & (dist <= window) if causal else dist.abs() <= window  # (chunk, span)
    first = torch.arange(n, device=q.device)[:, None] * chunk
    key_pos = first - chunk + s  # (n, span)
    real_key = (key_pos >= 0) & (key_pos < seq)
    # Padded queries (past the end) are dropped; letting them see every key keeps their rows finite,
    # so no NaN reaches the gradients of the real keys.
    pad_query = (first[:, :, None] + r) >= seq  # (n, chunk, 1)
    allowed = (band & real_key[:, None, :]) | pad_query  # (n, chunk, span)
    return scores.masked_fill(~allowed, float("-inf")), vb, qc


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int, *, causal: bool = True,
                             scale: float | None = None, chunk_size: int | None = None) -> Tensor:
    """Attention in which each query sees only the keys at most ``window`` positions away, in O(seq · window).

    The output equals ``softmax(q kᵀ · scale + M) v`` with M from
    :func:`~companion.attention.masks.sliding_window_mask` ``(seq, seq, window, causal=causal)``:
    with ``causal=True`` (Mistral) query ``p`` sees keys ``p - window … p``, with ``causal=False``
    (Longformer) ``p - window … p + window``. No ``(seq, seq)`` tensor is built: see the module
    docstring for the chunked computation.

    Args:
        q, k: queries and keys, ``(batch, heads, seq, head_dim)`` (self-attention: same ``seq``;
            leading dims broadcast).
        v: values, ``(batch, heads, seq, d_v)``.
        window: how far a query sees (``0``: itself only; ``>= seq``: every key, i.e. causal or full).
        causal: look back only (``True``) or both ways (``False``).
        scale: the factor on ``q kᵀ``; default ``1 / sqrt(head_dim)``.
        chunk_size: the chunk length, ``>= window`` (default ``window``); larger chunks mean fewer,
            bigger matrix products and more masked-out scores.

    Returns:
        ``(batch, heads, seq, d_v)``.
    """
    q, k, v = _check_self_attention(q, k, v, window, scale, causal)
    seq = q.shape[-2]
    chunk = _chunk_size(chunk_size, window, seq)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores, vb, _ = _local_scores(q, k, v, window, causal, chunk, scale)
    acc = torch.promote_types(scores.dtype, torch.float32)  # softmax in float32 at least, as in functional.py
    weights = torch.softmax(scores, dim=-1, dtype=acc).to(v.dtype)
    out = weights @ vb  # (*batch, n, chunk, d_v)
    return out.flatten(-3, -2)[..., :seq, :]


def _global_index(global_positions: object, seq: int, device: torch.device) -> Tensor:
    """``global_positions`` as a LongTensor ``(g,)`` on ``device``, checked to be distinct positions in ``[0, seq)``."""
    if isinstance(global_positions, Tensor):
        if global_positions.dim() != 1 or global_positions.is_floating_point() or global_positions.dtype == torch.bool:
            raise ValueError(f"global_positions must be a 1-D integer tensor or a sequence of ints, got a tensor "
                             f"of shape {tuple(global_positions.shape)} and dtype {global_positions.dtype}")
        index = global_positions.to(device=device, dtype=torch.long)
        if tracing():  # reading the values would be a host sync: checked in eager mode only
            return index
        values = index.tolist()
    elif isinstance(global_positions, Sequence) and all(
            isinstance(p, int) and not isinstance(p, bool) for p in global_positions):
        values = list(global_positions)
        index = torch.tensor(values, dtype=torch.long, device=device)
    else:
        raise ValueError(f"global_positions must be a 1-D integer tensor or a sequence of ints, "
                         f"got {global_positions!r}")
    if any(not 0 <= p < seq for p in values) or len(set(values)) != len(values):
        raise ValueError(f"global_positions must be distinct positions in [0, seq={seq}), got {values}")
    return index


def global_local_attention(q: Tensor, k: Tensor, v: Tensor, window: int, global_positions: Sequence[int] | Tensor,
                           *, causal: bool = False, scale: float | None = None,
                           chunk_size: int | None = None) -> Tensor:
    """Longformer attention (Beltagy et al., 2020): a sliding window plus global tokens, in O(seq · (window + g)).

    Query ``p`` sees the keys at most ``window`` positions away and every global position; a
    global query sees every key. This is dense attention with the mask
    ``sliding_window_mask(seq, window=window, causal=causal) | global rows | global columns``
    (intersected with :func:`~companion.attention.masks.causal_mask` when ``causal=True``), computed
    without an ``(seq, seq)`` tensor: local blocks as in :func:`sliding_window_attention`, joined
    with an ``(seq, g)`` block of global keys under one softmax, and the ``g`` global rows dense.

    Args:
        q, k, v: ``(batch, heads, seq, head_dim)`` (``v`` may have another last dim ``d_v``).
        window: the local reach (``0``: itself only).
        global_positions: the ``g`` global positions, distinct, in ``[0, seq)``, shared by the batch:
            a sequence of ints or a LongTensor ``(g,)`` (its values are checked in eager mode only).
        causal: ``False`` is Longformer; ``True`` also hides every later key (global ones included).
        scale, chunk_size: as in :func:`sliding_window_attention`.

    Returns:
        ``(batch, heads, seq, d_v)``.
    """
    q, k, v = _check_self_attention(q, k, v, window, scale, causal)
    seq = q.shape[-2]
    chunk = _chunk_size(chunk_size, window, seq)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    index = _global_index(global_positions, seq, q.device)  # (g,)
    local, vb, qc = _local_scores(q, k, v, window, causal, chunk, scale)  # (*batch, n, chunk, span)

    # Every query against the g global keys: (*batch, n, chunk, g). A global key inside the query's
    # window is already in the local block, so it is masked here (each key counted once).
    k_glob, v_glob = k.index_select(-2, index), v.index_select(-2, index)  # (*batch, g, ·)
    glob = (qc @ k_glob.unsqueeze(-3).transpose(-1, -2)) * scale
    pos = torch.arange(qc.shape[-3] * chunk, device=q.device).view(-1, chunk, 1)  # (n, chunk, 1)
    dist = pos - index  # (n, chunk, g)
    keep = dist > window if causal else dist.abs() > window  # causal: earlier than the window, never later
    glob = glob.masked_fill(~keep, float("-inf"))

    # One softmax over [local block | global keys]. The query's own key is always in the local block,
    # so no real row is all −∞.
    acc = torch.promote_types(local.dtype, torch.float32)
    weights = torch.softmax(torch.cat([local, glob], dim=-1), dim=-1, dtype=acc).to(v.dtype)
    span = local.shape[-1]
    out = weights[..., :span] @ vb + weights[..., span:] @ v_glob.unsqueeze(-3)  # (*batch, n, chunk, d_v)
    out = out.flatten(-3, -2)[..., :seq, :]

    # The global queries see every key (every earlier key when causal): g dense rows (*batch, g, seq).
    rows = (q.index_select(-2, index) @ k.transpose(-1, -2)) * scale
    if causal:
        later = torch.arange(seq, device=q.device) > index[:, None]  # (g, seq)
        rows = rows.masked_fill(later, float("-inf"))
    out_glob = torch.softmax(rows, dim=-1, dtype=acc).to(v.dtype) @ v  # (*batch, g, d_v)
    return out.index_copy(-2, index, out_glob)
