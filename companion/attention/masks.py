"""Attention masks: boolean, **True = may attend**, broadcastable to ``(batch, heads, q_len, k_len)``.

* :func:`causal_mask` — a decoder sees itself and the past (the autoregressive property);
* :func:`sliding_window_mask` — local attention, causal (Mistral) or symmetric (Longformer);
* :func:`padding_mask` — no query looks at a padded key;
* :func:`combine_masks` intersects them; :func:`mask_to_bias` gives the additive form M (0 or −∞).

Queries are taken to be the **last** ``q_len`` of the ``k_len`` positions, which is what cached
decoding needs: with 5 cached tokens and 1 new query, ``causal_mask(1, 6)`` lets it see all 6 keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from companion.attention._checks import check_length

__all__ = ["causal_mask", "sliding_window_mask", "padding_mask", "combine_masks", "mask_to_bias"]


def _positions(q_len: int, k_len: int, device: torch.device | str | None) -> tuple[Tensor, Tensor]:
    """Absolute positions of queries (column) and keys (row); the queries are the *last* q_len tokens."""
    offset = k_len - q_len  # keys before the first query: the cached past in generation
    i = torch.arange(q_len, device=device).unsqueeze(1) + offset
    j = torch.arange(k_len, device=device).unsqueeze(0)
    return i, j


def causal_mask(q_len: int, k_len: int | None = None, *, device: torch.device | str | None = None) -> Tensor:
    """Lower-triangular mask ``(q_len, k_len)``: query ``i`` may see keys ``j <= i + k_len - q_len``.

    The queries are taken to be the last ``q_len`` of the ``k_len`` positions, which is what
    cached decoding needs: with 5 cached tokens and 1 new query, ``causal_mask(1, 6)`` lets it see
    all 6 keys. ``k_len`` defaults to ``q_len`` (the square mask of decoder self-attention).
    """
    q_len = check_length("q_len", q_len)
    k_len = q_len if k_len is None else check_length("k_len", k_len)
    i, j = _positions(q_len, k_len, device)
    return j <= i


def sliding_window_mask(
    q_len: int,
    k_len: int | None = None,
    window: int = 1,
    *,
    causal: bool = True,
    device: torch.device | str | None = None,
) -> Tensor:
    """Local attention ``(q_len, k_len)``: each query sees keys at most ``window`` positions away.

    With ``causal=True`` (Mistral-style) query at position ``p`` sees keys ``p - window ... p``;
    with ``causal=False`` (Longformer-style) it sees ``p - window ... p + window``. Positions follow
    :func:`causal_mask` (queries are the last ``q_len`` positions). Cost per query: O(window)
    keys instead of O(k_len).
    """
    q_len = check_length("q_len", q_len)
    k_len = q_len if k_len is None else check_length("k_len", k_len)
    window = check_length("window", window, minimum=0)
    i, j = _positions(q_len, k_len, device)
    dist = i - j
    return (dist >= 0) & (dist <= window) if causal else dist.abs() <= window


def padding_mask(
    lengths: Tensor | Sequence[int] | None = None,
    max_len: int | None = None,
    *,
    ids: Tensor | None = None,
    pad_id: int | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Key-padding mask ``(batch, 1, 1, seq)``: True at real tokens, False at padding.

    Give either ``lengths`` (the number of real tokens of each sequence, padded on the right to
    ``max_len``, default the longest) or ``ids`` ``(batch, seq)`` with the ``pad_id`` that marks
    padding. The two singleton dims broadcast over heads and queries, so every query ignores the
    padded keys.
    """
    if (lengths is None) == (ids is None):
        raise ValueError("padding_mask needs exactly one of lengths= or ids= (with pad_id=)")
    if ids is not None:
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point():
            got = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"ids must be an integer tensor of shape (batch, seq), got {got}")
        if isinstance(pad_id, bool) or not isinstance(pad_id, int):
            raise ValueError(f"pad_id must be an int when ids= is given, got {pad_id!r}")
        return (ids != pad_id)[:, None, None, :].to(device or ids.device)
    if isinstance(lengths, Tensor):
        if lengths.dim() != 1 or lengths.is_floating_point():
            raise ValueError(f"lengths must be a 1-D integer tensor, got shape {tuple(lengths.shape)}, "
                             f"dtype {lengths.dtype}")
        lengths_t = lengths.to(device) if device is not None else lengths
    else:
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in lengths):
            raise ValueError(f"lengths must be a sequence of ints, got {lengths!r}")
        lengths_t = torch.tensor(list(lengths), dtype=torch.long, device=device)
    if lengths_t.numel() == 0 or (lengths_t < 0).any():
        raise ValueError(f"lengths must be non-empty and non-negative, got {lengths_t.tolist()}")
    longest = int(lengths_t.max())
    max_len = longest if max_len is None else check_length("max_len", max_len)
    if max_len < longest:
        raise ValueError(f"max_len={max_len} is shorter than the longest sequence ({longest})")
    keep = torch.arange(max_len, device=lengths_t.device).unsqueeze(0) < lengths_t.unsqueeze(1)
    return keep[:, None, None, :]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Intersect bool masks (a key is allowed only if every mask allows it); ``None`` entries are skipped.

    Shapes broadcast: ``combine_masks(causal_mask(L), padding_mask(lengths))`` gives
    ``(batch, 1, L, L)``. Returns ``None`` when every mask is ``None``.
    """
    out = None
    for n, m in enumerate(masks):
        if m is None:
            continue
        if not isinstance(m, Tensor) or m.dtype != torch.bool:
            got = m.dtype if isinstance(m, Tensor) else type(m).__name__
            raise ValueError(f"combine_masks: mask #{n} must be a bool tensor, got {got}")
        if out is None:
            out = m
            continue
        try:
            torch.broadcast_shapes(out.shape, m.shape)
        except RuntimeError as err:
            raise ValueError(
                f"combine_masks: mask #{n} of shape {tuple(m.shape)} does not broadcast with the "
                f"masks before it, of shape {tuple(out.shape)}"
            ) from err
        out = out & m
    return out


def mask_to_bias(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """The additive form M of a bool mask: 0 where True (may attend), -inf where False."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a bool tensor, got {got}")
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
