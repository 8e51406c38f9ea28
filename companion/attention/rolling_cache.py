"""A rolling KV cache: sliding-window decoding in O(window) memory, whatever the length.

With causal sliding-window attention (:func:`~companion.attention.masks.sliding_window_mask`,
``causal=True``) the query at position ``p`` sees only the keys ``p - window … p``: ``window + 1``
of them. Keys older than that are never read again, so a cache need not keep them. Mistral's
*rolling buffer cache* (Jiang et al., 2023, §2) keeps a ring of ``window + 1`` slots per layer and
writes the token at position ``p`` into slot ``p mod (window + 1)``, over the token that has just
left the window::

    slot(p) = p mod (window + 1)        memory = 2 · layers · kv_heads · head_dim · (window + 1) values

:class:`RollingKVCache` preallocates one ``(n_layers, batch, kv_heads, window + 1, head_dim)``
tensor for keys and one for values, like :class:`~companion.attention.kv_cache.KVCache`, with the
same methods (:meth:`~RollingKVCache.update`, :meth:`~RollingKVCache.seq_len`,
:meth:`~RollingKVCache.reset`, :attr:`~RollingKVCache.memory_bytes`); the memory never grows, 100
tokens or 100 000.

Once the ring has wrapped, its slots are **out of order** (the oldest token sits in the middle).
That is harmless: attention is a weighted sum over a *set* of keys, invariant to their order, as
long as nothing in the score depends on a key's slot. Rotary embeddings (RoPE) are applied to the
keys *before* they are cached, so the positions travel inside the keys; an additive bias indexed
by slot (ALiBi, T5's buckets) would need the true positions instead.

Example::

    >>> cache = RollingKVCache(n_layers=1, batch_size=1, n_kv_heads=2, head_dim=16, window=4)
    >>> for t in range(100):                                   # decode: one token at a time
    ...     k_all, v_all = cache.update(0, torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16))
    >>> k_all.shape                                            # the last window + 1 = 5 tokens
    torch.Size([1, 2, 5, 16])
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion.attention._checks import check_length
from companion.attention.kv_cache import _check_kv, _check_layer, _check_sizes

__all__ = ["RollingKVCache"]


class RollingKVCache:
    """Keys and values of the last ``window + 1`` tokens, for ``n_layers`` sliding-window attention layers.

    Args:
        n_layers: slots, one per attention layer (layer ``i`` uses slot ``i``).
        batch_size: sequences decoded together.
        n_kv_heads: key/value heads per layer.
        head_dim: per-head width.
        window: the layers' causal window: query ``p`` sees keys ``p - window … p``
            (:func:`~companion.attention.masks.sliding_window_mask` with ``causal=True``).
        dtype, device: of the stored tensors (match the model's).

    ``keys[layer]`` and ``values[layer]`` are rings ``(batch, kv_heads, window + 1, head_dim)``:
    the token at position ``p`` lives in slot ``p mod (window + 1)``. :meth:`update` returns what
    the new queries must attend to; attend over it with
    ``sliding_window_mask(new, k_len, window)`` (all True for one new token).
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, window: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        check_length("window", window, minimum=0)
        _check_sizes(n_layers, batch_size, n_kv_heads, head_dim, window + 1, dtype)
        shape = (n_layers, batch_size, n_kv_heads, window + 1, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = [0] * n_layers  # tokens seen by each layer, not tokens stored

    def __repr__(self) -> str:
        n_layers, batch, heads, _, head_dim = self.keys.shape
        return (f"RollingKVCache(n_layers={n_layers}, batch_size={batch}, n_kv_heads={heads}, head_dim={head_dim}, "
                f"window={self.window}, seen={self.lengths[0]})")

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def window(self) -> int:
        """The causal window: the ring keeps ``window + 1`` tokens."""
        return self.keys.shape[3] - 1

    @property
    def memory_bytes(self) -> int:
        """Bytes allocated for keys and values: ``window + 1`` tokens per layer, independent of the length."""
        return self.keys.nbytes + self.values.nbytes

    def _layer(self, layer: object) -> int:
        return _check_layer(layer, len(self.lengths))

    def seq_len(self, layer: int = 0) -> int:
        """Tokens seen by ``layer`` so far: the position of the next token (not the number stored)."""
        return self.lengths[self._layer(layer)]

    def stored(self, layer: int = 0) -> int:
        """Tokens held in ``layer``'s ring: ``min(seq_len, window + 1)``."""
        return min(self.seq_len(layer), self.window + 1)

    def _ordered(self, layer: int, n: int) -> tuple[Tensor, Tensor]:
        """The last ``n`` stored tokens of ``layer``, oldest first, ``(batch, kv_heads, n, head_dim)``."""
        slots = self.window + 1
        seen = self.lengths[layer]
        index = torch.arange(seen - n, seen, device=self.keys.device) % slots
        return self.keys[layer].index_select(2, index), self.values[layer].index_select(2, index)

    def _write(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Write ``k``, ``v`` (at most ``window + 1`` tokens) at the next positions, in place, wrapping round."""
        slots = self.window + 1
        start, new = self.lengths[layer] % slots, k.shape[2]
        first = min(new, slots - start)  # up to the end of the ring, then from slot 0
        for buffer, x in ((self.keys[layer], k), (self.values[layer], v)):
            buffer.narrow(2, start, first).copy_(x.narrow(2, 0, first))
            buffer.narrow(2, 0, new - first).copy_(x.narrow(2, first, new - first))

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add ``k``, ``v`` ``(batch, kv_heads, new, head_dim)`` to ``layer``; return the keys and values to attend to.

        * One new token (decoding): the ring itself, ``(batch, kv_heads, min(seq_len, window + 1),
          head_dim)`` — the new token and the ``window`` before it, out of order once the ring has
          wrapped (order does not matter: see the module docstring). Nothing is copied.
        * Several (a prompt, or a chunk of one): the ``min(window, past)`` cached tokens before
          them, oldest first, followed by the new ones, ``(batch, kv_heads, k_len, head_dim)``; the
          queries are the last ``new`` positions, so ``sliding_window_mask(new, k_len, window)``
          gives each its window. Only the last ``window + 1`` of them stay in the ring.
        """
        layer = self._layer(layer)
        _, batch, heads, slots, head_dim = self.keys.shape
        _check_kv(k, v, batch, heads, head_dim)
        new = k.shape[2]
        if new == 1:
            self._write(layer, k, v)
            self.lengths[layer] += 1
            n = min(self.lengths[layer], slots)
            return self.keys[layer].narrow(2, 0, n), self.values[layer].narrow(2, 0, n)
        past_k, past_v = self._ordered(layer, min(self.lengths[layer], self.window))
        keep = min(new, slots)  # older prompt tokens are out of every later query's window
        self.lengths[layer] += new - keep  # skip the positions of the dropped tokens: slots stay p mod slots
        self._write(layer, k.narrow(2, new - keep, keep), v.narrow(2, new - keep, keep))
        self.lengths[layer] += keep
        return torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` ``(new_batch,)`` (beam search: each beam continues a parent)."""
        if not isinstance(index, Tensor) or index.dim() != 1 or index.is_floating_point():
            raise ValueError(f"index must be a 1-D integer tensor of batch rows, got {index!r}")
        self.keys = self.keys.index_select(1, index.to(self.keys.device))
        self.values = self.values.index_select(1, index.to(self.values.device))

    def reset(self) -> None:
        """Empty every slot (start new sequences); the memory stays allocated."""
        self.lengths = [0] * len(self.lengths)
