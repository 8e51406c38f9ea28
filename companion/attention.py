"""Attention: scaled dot-product attention, masks, multi-head attention (MHA, GQA, MQA) and a KV cache.

The whole module is one equation (Vaswani et al., 2017, eq. 1) and the plumbing around it::

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V

* :func:`scaled_dot_product_attention` writes that equation out, step by step, and returns the
  attention weights as well as the output. :func:`fused_attention` computes the same output with
  ``torch.nn.functional.scaled_dot_product_attention`` (FlashAttention-style fused kernels, which
  never materialise the ``(q_len, k_len)`` weight matrix), under the same mask conventions.
* Masks are **boolean, True = may attend**, broadcastable to ``(batch, heads, q_len, k_len)``. The
  builders :func:`causal_mask`, :func:`padding_mask` and :func:`sliding_window_mask` make them and
  :func:`combine_masks` intersects them. A query whose every key is masked gets an output of zeros
  (and zero weights), never NaN, on both paths.
* ``bias`` is an additive float bias on the scores (ALiBi, T5's relative buckets), broadcastable
  to the same shape.
* :class:`MultiHeadAttention` projects, splits into heads, attends and recombines (eq. 4-5 of the
  paper); ``n_kv_heads`` < ``n_heads`` gives grouped-query (GQA) and multi-query (MQA) attention.
* :class:`KVCache` stores the keys and values of past tokens, layer by layer, for generation.

Shapes use ``batch``, ``heads`` (query heads), ``kv_heads``, ``q_len``/``k_len`` (sequence lengths
of queries and of keys/values) and ``d_head`` (the per-head width, d_k in the paper).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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
    "kv_cache_bytes",
]

# A rotary hook: (x of shape (batch, heads, seq, d_head), positions of shape (seq,) or (batch, seq))
# -> a tensor of the same shape as x. See MultiHeadAttention.
RotaryFn = Callable[[Tensor, Tensor], Tensor]


# --------------------------------------------------------------------------------------------
# Input checks: every public function reports bad input by name, with the shapes it saw.
# --------------------------------------------------------------------------------------------


def _check_tensor(name: str, x: object, min_dim: int = 0, floating: bool = True) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(x.shape)}")
    return x


def _broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    """True when a tensor of ``shape`` broadcasts to exactly ``target`` (without enlarging it)."""
    if len(shape) > len(target):
        return False
    return all(s == 1 or s == t for s, t in zip(reversed(shape), reversed(target)))


def _check_mask_and_bias(mask: Tensor | None, bias: Tensor | None, scores_shape: Sequence[int]) -> None:
    target = tuple(scores_shape)
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask must be a bool torch.Tensor or None, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise ValueError(
                f"mask must be a bool tensor (True = may attend), got dtype {mask.dtype}; "
                "for an additive float mask pass it as bias="
            )
        if not _broadcasts_to(mask.shape, target):
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to the attention scores of shape "
                f"{target} (batch, heads, q_len, k_len)"
            )
    if bias is not None:
        if not isinstance(bias, Tensor) or not bias.is_floating_point():
            got = bias.dtype if isinstance(bias, Tensor) else type(bias).__name__
            raise TypeError(f"bias must be a floating-point torch.Tensor or None, got {got}")
        if not _broadcasts_to(bias.shape, target):
            raise ValueError(
                f"bias of shape {tuple(bias.shape)} does not broadcast to the attention scores of shape "
                f"{target} (batch, heads, q_len, k_len)"
            )


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, ...]:
    """Validate q, k, v and return the shape of the score matrix ``(*batch, q_len, k_len)``."""
    _check_tensor("q", q, 2)
    _check_tensor("k", k, 2)
    _check_tensor("v", v, 2)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same head dimension d_k (last dim): q has shape {tuple(q.shape)}, "
            f"k has shape {tuple(k.shape)}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length k_len (dim -2): k has shape {tuple(k.shape)}, "
            f"v has shape {tuple(v.shape)}"
        )
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError as err:
        raise ValueError(
            f"the leading (batch, heads) dims of q {tuple(q.shape)}, k {tuple(k.shape)} and "
            f"v {tuple(v.shape)} do not broadcast together"
        ) from err
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    return (*batch, q.shape[-2], k.shape[-2])


def _check_dropout(dropout_p: float) -> None:
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")


def _check_scale(scale: float | None) -> None:
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0):
        raise ValueError(f"scale must be None or a positive float, got {scale!r}")


# --------------------------------------------------------------------------------------------
# Scaled dot-product attention: explicit and fused.
# --------------------------------------------------------------------------------------------


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
        q: queries, ``(batch, heads, q_len, d_head)`` (any number of leading dims works).
        k: keys, ``(batch, heads, k_len, d_head)``.
        v: values, ``(batch, heads, k_len, d_v)``.
        mask: optional bool tensor broadcastable to ``(batch, heads, q_len, k_len)``;
            True = the query may attend to that key. Masked scores become -inf (the matrix M of
            the seeds, with entries 0 or -inf) so their weight is exactly zero.
        bias: optional additive float tensor broadcastable to ``(batch, heads, q_len, k_len)``,
            added to the scaled scores (ALiBi's linear penalties, T5's relative-position buckets).
        dropout_p: probability of zeroing an attention weight (applied whenever > 0; pass 0.0 at
            evaluation). The survivors are scaled by ``1 / (1 - dropout_p)``.
        scale: the factor on ``q kᵀ``; default ``1 / sqrt(d_head)``.

    Returns:
        ``(output, weights)``: output ``(batch, heads, q_len, d_v)`` and the attention weights
        ``(batch, heads, q_len, k_len)`` before dropout (each row sums to 1). A query with no
        allowed key gets an all-zero row in both, never NaN.
    """
    scores_shape = _check_qkv(q, k, v)
    _check_mask_and_bias(mask, bias, scores_shape)
    _check_dropout(dropout_p)
    _check_scale(scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale

    scores = (q @ k.transpose(-2, -1)) * scale  # (batch, heads, q_len, k_len): every query · every key
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    row_ok = None
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
        # A row of all -inf would give softmax 0/0 = NaN (and NaN gradients). Give such rows
        # finite scores, then zero their weights after the softmax.
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
    kernel that computes the softmax block by block and never stores the
    ``(q_len, k_len)`` weights, which is what makes it fast and O(L) in memory
    (Dao et al., 2022).

    ``is_causal=True`` (only with ``mask=None``, ``bias=None`` and ``q_len == k_len``) asks the
    kernel to apply the causal mask itself, which lets it skip the masked blocks.
    """
    scores_shape = _check_qkv(q, k, v)
    _check_mask_and_bias(mask, bias, scores_shape)
    _check_dropout(dropout_p)
    _check_scale(scale)
    if is_causal and (mask is not None or bias is not None or q.shape[-2] != k.shape[-2]):
        raise ValueError(
            "is_causal=True needs mask=None, bias=None and q_len == k_len; got "
            f"mask={'a tensor' if mask is not None else None}, bias={'a tensor' if bias is not None else None}, "
            f"q_len={q.shape[-2]}, k_len={k.shape[-2]} (pass causal_mask(q_len, k_len) as mask instead)"
        )
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
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )
    if row_ok is not None:
        out = out * row_ok
    return out


# --------------------------------------------------------------------------------------------
# Masks (bool, True = may attend).
# --------------------------------------------------------------------------------------------


def _check_length(name: str, n: object, minimum: int = 1) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {n!r}")
    return n


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
    all 6 keys. ``k_len`` defaults to ``q_len`` (the square mask of the seeds, eq. for M_ij).
    """
    q_len = _check_length("q_len", q_len)
    k_len = q_len if k_len is None else _check_length("k_len", k_len)
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
    q_len = _check_length("q_len", q_len)
    k_len = q_len if k_len is None else _check_length("k_len", k_len)
    window = _check_length("window", window, minimum=0)
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
            raise ValueError(f"lengths must be a 1-D integer tensor, got shape {tuple(lengths.shape)}, dtype {lengths.dtype}")
        lengths_t = lengths.to(device) if device is not None else lengths
    else:
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in lengths):
            raise ValueError(f"lengths must be a sequence of ints, got {lengths!r}")
        lengths_t = torch.tensor(list(lengths), dtype=torch.long, device=device)
    if lengths_t.numel() == 0 or (lengths_t < 0).any():
        raise ValueError(f"lengths must be non-empty and non-negative, got {lengths_t.tolist()}")
    longest = int(lengths_t.max())
    max_len = longest if max_len is None else _check_length("max_len", max_len)
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


# --------------------------------------------------------------------------------------------
# KV cache.
# --------------------------------------------------------------------------------------------


def kv_cache_bytes(
    n_layers: int,
    n_kv_heads: int,
    head_dim: int,
    n_tokens: int,
    bytes_per_element: int = 2,
    batch_size: int = 1,
) -> int:
    """Size of a KV cache: ``2 · layers · kv_heads · head_dim · tokens · bytes_per_element · batch``.

    The 2 counts keys and values. ``bytes_per_element`` is 2 for fp16/bf16, 4 for fp32.
    """
    for name, val in [
        ("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
        ("bytes_per_element", bytes_per_element), ("batch_size", batch_size),
    ]:
        _check_length(name, val)
    _check_length("n_tokens", n_tokens, minimum=0)
    return 2 * n_layers * n_kv_heads * head_dim * n_tokens * bytes_per_element * batch_size


class KVCache:
    """Keys and values of the tokens seen so far, one slot per layer, for autoregressive decoding.

    Each :class:`MultiHeadAttention` with ``layer_idx=i`` reads and appends slot ``i``: at every
    step it computes keys/values for the new tokens only, appends them ``(batch, kv_heads, new,
    d_head)`` along the sequence dim, and attends over everything stored. Without a cache every
    step would recompute the keys and values of the whole prefix: O(n²) projections for n tokens
    instead of O(n).

    For cross-attention the slot holds the projected encoder output: computed at the first call,
    reused unchanged afterwards (use a separate ``KVCache`` for the cross-attention layers of a
    decoder). Storing with ``torch.cat`` keeps this readable; a production cache pre-allocates.
    """

    def __init__(self, n_layers: int) -> None:
        _check_length("n_layers", n_layers)
        self.n_layers = n_layers
        self.keys: list[Tensor | None] = [None] * n_layers
        self.values: list[Tensor | None] = [None] * n_layers

    def _check_layer(self, layer: int) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be an int in [0, {self.n_layers}), got {layer!r}")
        return layer

    def __len__(self) -> int:
        return self.n_layers

    def seq_len(self, layer: int = 0) -> int:
        """Number of tokens stored for ``layer`` (0 when empty)."""
        k = self.keys[self._check_layer(layer)]
        return 0 if k is None else k.shape[-2]

    def get(self, layer: int) -> tuple[Tensor, Tensor] | None:
        """The stored ``(keys, values)`` of ``layer``, each ``(batch, kv_heads, seq, d_head)``, or None."""
        layer = self._check_layer(layer)
        k, v = self.keys[layer], self.values[layer]
        return None if k is None or v is None else (k, v)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k``, ``v`` ``(batch, kv_heads, new, d_head)`` to ``layer``; return all stored keys and values."""
        layer = self._check_layer(layer)
        _check_tensor("k", k, 4)
        _check_tensor("v", v, 4)
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is not None and old_v is not None:
            if (old_k.shape[0], old_k.shape[1], old_k.shape[3]) != (k.shape[0], k.shape[1], k.shape[3]):
                raise ValueError(
                    f"new keys of shape {tuple(k.shape)} do not match the cached keys of shape "
                    f"{tuple(old_k.shape)} in (batch, kv_heads, d_head)"
                )
            k, v = torch.cat([old_k, k], dim=-2), torch.cat([old_v, v], dim=-2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def set(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Overwrite ``layer``'s slot (the cross-attention case)."""
        layer = self._check_layer(layer)
        self.keys[layer], self.values[layer] = None, None
        self.update(layer, k, v)

    def reset(self) -> None:
        """Empty every slot (start a new sequence)."""
        self.keys = [None] * self.n_layers
        self.values = [None] * self.n_layers

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the stored tensors; equals :func:`kv_cache_bytes` for a full cache."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values) if t is not None)


# --------------------------------------------------------------------------------------------
# Multi-head attention.
# --------------------------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """Multi-head attention: self-, cross-, grouped-query and multi-query (Vaswani et al., 2017, §3.2.2).

    ``head_i = Attention(X W_i^Q, Y W_i^K, Y W_i^V)`` and
    ``MultiHead(X, Y) = Concat(head_1, ..., head_h) W^O``, with ``Y = X`` for self-attention and
    ``Y = context`` (the encoder output) for cross-attention. Each head works in a
    ``d_head = d_model / n_heads`` subspace, so h heads cost about what one full-width head costs.

    ``n_kv_heads`` (default ``n_heads``) sets how many key/value heads there are: each group of
    ``n_heads / n_kv_heads`` query heads shares one (GQA, Ainslie et al., 2023); ``n_kv_heads=1``
    is multi-query attention (Shazeer, 2019). Only the keys/values shrink, and with them the KV
    cache, by ``n_heads / n_kv_heads``.

    As in nanoGPT and ``torch.nn.MultiheadAttention``, W^Q, W^K, W^V are stacked in one
    ``in_proj`` Linear (rows: the ``n_heads`` query heads, then the keys, then the values), so
    self-attention projects with one matmul; ``out_proj`` is W^O.

    Args:
        d_model: model width.
        n_heads: query heads; must divide ``d_model``.
        n_kv_heads: key/value heads; must divide ``n_heads``. None = ``n_heads`` (plain MHA).
        dropout: dropout on the attention weights, active in training mode only.
        bias: whether the projections have biases.
        scale: factor on q·kᵀ; default ``1/sqrt(d_head)`` (T5 uses 1.0).
        rotary: optional hook for rotary position embeddings (RoPE): a callable (or module)
            ``rotary(x, positions) -> x_rotated`` applied to the queries and the new keys after
            projection and before caching, with ``x`` of shape ``(batch, heads, seq, d_head)`` and
            ``positions`` a LongTensor ``(seq,)`` or ``(batch, seq)`` of absolute positions.
            Applied in self-attention only (positions of two different sequences do not compare).
        layer_idx: which slot of a :class:`KVCache` this layer uses.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        *,
        scale: float | None = None,
        rotary: RotaryFn | None = None,
        layer_idx: int = 0,
    ) -> None:
        super().__init__()
        _check_length("d_model", d_model)
        _check_length("n_heads", n_heads)
        n_kv_heads = n_heads if n_kv_heads is None else _check_length("n_kv_heads", n_kv_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model must be divisible by n_heads, got d_model={d_model}, n_heads={n_heads}")
        if n_heads % n_kv_heads:
            raise ValueError(
                f"n_kv_heads must divide n_heads (each group of query heads shares one key/value head), "
                f"got n_heads={n_heads}, n_kv_heads={n_kv_heads}"
            )
        _check_dropout(dropout)
        _check_scale(scale)
        if rotary is not None and not callable(rotary):
            raise TypeError(f"rotary must be None or a callable (x, positions) -> x, got {type(rotary).__name__}")
        _check_length("layer_idx", layer_idx, minimum=0)
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.dropout = float(dropout)
        self.scale = scale
        self.rotary = rotary
        self.layer_idx = layer_idx
        self.in_proj = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.d_head, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections and zero biases, as ``torch.nn.MultiheadAttention``."""
        nn.init.xavier_uniform_(self.in_proj.weight)
        self.out_proj.reset_parameters()
        for lin in (self.in_proj, self.out_proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
            f"d_head={self.d_head}, dropout={self.dropout}"
        )

    def _split_heads(self, t: Tensor, heads: int) -> Tensor:
        # (batch, seq, heads * d_head) -> (batch, heads, seq, d_head); a view, no copy
        return t.view(t.shape[0], t.shape[1], heads, self.d_head).transpose(1, 2)

    def _repeat_kv(self, t: Tensor) -> Tensor:
        # (batch, kv_heads, seq, d_head) -> (batch, heads, seq, d_head): query head i uses kv head
        # i // group, i.e. consecutive query heads form a group.
        group = self.n_heads // self.n_kv_heads
        if group == 1:
            return t
        b, hkv, s, d = t.shape
        return t[:, :, None].expand(b, hkv, group, s, d).reshape(b, hkv * group, s, d)

    def _check_inputs(self, x: Tensor, context: Tensor | None) -> None:
        _check_tensor("x", x)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, seq, d_model={self.d_model}), got {tuple(x.shape)}")
        if context is not None:
            _check_tensor("context", context)
            if context.dim() != 3 or context.shape[-1] != self.d_model:
                raise ValueError(
                    f"context must have shape (batch, k_len, d_model={self.d_model}), got {tuple(context.shape)}"
                )
            if context.shape[0] != x.shape[0]:
                raise ValueError(
                    f"context batch size {context.shape[0]} (shape {tuple(context.shape)}) differs from "
                    f"x batch size {x.shape[0]} (shape {tuple(x.shape)})"
                )

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        kv_cache: KVCache | None = None,
        need_weights: bool = False,
        *,
        causal: bool = False,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` to itself (or to ``context``).

        Args:
            x: ``(batch, q_len, d_model)``, the queries' sequence.
            context: ``(batch, k_len, d_model)`` for cross-attention; None for self-attention.
            mask: bool, True = may attend, broadcastable to ``(batch, heads, q_len, k_len)``, where
                ``k_len`` counts cached tokens too (see :func:`padding_mask`, :func:`causal_mask`).
            bias: additive float bias broadcastable to ``(batch, heads, q_len, k_len)``.
            kv_cache: a :class:`KVCache`; this layer appends its new keys/values to slot
                ``layer_idx`` and attends over all of them.
            need_weights: also return the per-head weights ``(batch, heads, q_len, k_len)``;
                this takes the explicit path. Otherwise the fused kernel runs (same output to ~1e-6
                in fp32).
            causal: add the causal mask (offset by the cached length), so callers need not build it.
            positions: absolute positions of the ``q_len`` new tokens for the ``rotary`` hook,
                ``(q_len,)`` or ``(batch, q_len)``; default ``cached + arange(q_len)``.

        Returns:
            ``(output, weights)``: output ``(batch, q_len, d_model)``; weights as above or None.
        """
        self._check_inputs(x, context)
        if kv_cache is not None and not isinstance(kv_cache, KVCache):
            raise TypeError(f"kv_cache must be a KVCache or None, got {type(kv_cache).__name__}")
        h, hkv, d = self.n_heads, self.n_kv_heads, self.d_head
        q_rows, kv_rows = h * d, hkv * d
        batch, q_len, _ = x.shape
        past = kv_cache.seq_len(self.layer_idx) if kv_cache is not None else 0

        if context is None:  # self-attention: one matmul for q, k and v
            q, k, v = self.in_proj(x).split([q_rows, kv_rows, kv_rows], dim=-1)
            q, k, v = self._split_heads(q, h), self._split_heads(k, hkv), self._split_heads(v, hkv)
            if self.rotary is not None:
                pos = self._positions(positions, batch, q_len, past, x.device)
                q, k = self.rotary(q, pos), self.rotary(k, pos)
            if kv_cache is not None:
                k, v = kv_cache.update(self.layer_idx, k, v)
        else:  # cross-attention: queries from x, keys/values from context (computed once if cached)
            w_q, w_kv = self.in_proj.weight.split([q_rows, 2 * kv_rows])
            b_q, b_kv = self.in_proj.bias.split([q_rows, 2 * kv_rows]) if self.in_proj.bias is not None else (None, None)
            q = self._split_heads(F.linear(x, w_q, b_q), h)
            cached = kv_cache.get(self.layer_idx) if kv_cache is not None else None
            if cached is None:
                k, v = F.linear(context, w_kv, b_kv).split([kv_rows, kv_rows], dim=-1)
                k, v = self._split_heads(k, hkv), self._split_heads(v, hkv)
                if kv_cache is not None:
                    kv_cache.set(self.layer_idx, k, v)
            else:
                k, v = cached
        k_len = k.shape[-2]
        k, v = self._repeat_kv(k), self._repeat_kv(v)

        _check_mask_and_bias(mask, bias, (batch, h, q_len, k_len))
        dropout_p = self.dropout if self.training else 0.0
        use_is_causal = False
        if causal:
            if mask is None and bias is None and q_len == k_len and not need_weights:
                use_is_causal = True  # let the fused kernel mask (and skip) the upper triangle itself
            elif q_len > 1:  # one new query sees every cached key: nothing to mask
                mask = combine_masks(mask, causal_mask(q_len, k_len, device=x.device))

        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask, bias, dropout_p, scale=self.scale)
        else:
            out = fused_attention(q, k, v, mask, bias, dropout_p, scale=self.scale, is_causal=use_is_causal)
            weights = None
        out = out.transpose(1, 2).reshape(batch, q_len, h * d)  # concatenate the heads
        return self.out_proj(out), weights

    def _positions(self, positions: Tensor | None, batch: int, q_len: int, past: int, device: torch.device) -> Tensor:
        if positions is None:
            return torch.arange(past, past + q_len, device=device)
        if not isinstance(positions, Tensor) or positions.is_floating_point():
            raise TypeError(f"positions must be an integer tensor, got {getattr(positions, 'dtype', type(positions).__name__)}")
        if tuple(positions.shape) not in ((q_len,), (batch, q_len)):
            raise ValueError(
                f"positions must have shape (q_len,)=({q_len},) or (batch, q_len)=({batch}, {q_len}), "
                f"got {tuple(positions.shape)}"
            )
        return positions
