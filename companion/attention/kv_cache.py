"""The KV cache: keys and values of past tokens, kept so that generation computes each only once.

Generating token ``t + 1`` needs the keys and values of tokens ``0 … t`` in every layer. Without a
cache, each step recomputes them for the whole prefix: O(n²) projections to generate n tokens.
With one, each step projects only the new token and appends its key and value (Pope et al.,
2023). The attention itself still reads every cached key: a step costs O(t) there, which is why
a cached step grows (slowly) with the prefix.

:class:`KVCache` is **preallocated**: one ``(n_layers, batch, kv_heads, max_len, head_dim)`` tensor
for keys and one for values, written in place, so a step allocates nothing and copies nothing
old. Models make one with ``model.make_cache(batch_size)`` and pass it to every call; each
attention layer appends to its own slot, and the model reads the number of cached tokens
(:meth:`KVCache.seq_len`) to continue positions from there.

:class:`StaticKVCache` is the same memory with shapes that never change, for a *compiled*
decoding step: each step writes at positions given as a tensor and attends over every slot, with
a mask that hides the slots after the query (what PyTorch's gpt-fast example and Hugging Face's
``StaticCache`` do). One graph then serves every step, and on a GPU CUDA graphs can replay it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion.attention._checks import check_length, check_tensor

__all__ = ["KVCache", "StaticKVCache", "kv_cache_bytes"]


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, n_tokens: int, bytes_per_element: int = 2,
                   batch_size: int = 1) -> int:
    """Size of a KV cache: ``2 · layers · kv_heads · head_dim · tokens · bytes_per_element · batch``.

    The 2 counts keys and values. ``bytes_per_element`` is 2 for fp16/bf16, 4 for fp32.
    """
    for name, value in [("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
                        ("bytes_per_element", bytes_per_element), ("batch_size", batch_size)]:
        check_length(name, value)
    check_length("n_tokens", n_tokens, minimum=0)
    return 2 * n_layers * n_kv_heads * head_dim * n_tokens * bytes_per_element * batch_size


def _check_sizes(n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype) -> None:
    for name, value in (("n_layers", n_layers), ("batch_size", batch_size), ("n_kv_heads", n_kv_heads),
                        ("head_dim", head_dim), ("max_len", max_len)):
        check_length(name, value)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")


def _check_layer(layer: object, n_layers: int) -> int:
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n_layers:
        raise ValueError(f"layer must be an int in [0, {n_layers}), got {layer!r}")
    return layer


def _check_kv(k: Tensor, v: Tensor, batch: int, heads: int, head_dim: int) -> None:
    check_tensor("k", k, 4)
    check_tensor("v", v, 4)
    if k.shape != v.shape or (k.shape[0], k.shape[1], k.shape[3]) != (batch, heads, head_dim):
        raise ValueError(f"k and v must both have shape (batch={batch}, kv_heads={heads}, new, "
                         f"head_dim={head_dim}), got {tuple(k.shape)} and {tuple(v.shape)}")


class KVCache:
    """Preallocated keys and values for ``n_layers`` attention layers.

    Args:
        n_layers: slots, one per attention layer (layer ``i`` uses slot ``i``).
        batch_size: sequences decoded together.
        n_kv_heads: key/value heads per layer (fewer than the query heads with GQA/MQA).
        head_dim: per-head width.
        max_len: most tokens a slot can hold (prompt + generated).
        dtype, device: of the stored tensors (match the model's).

    Each slot holds ``keys[layer]`` and ``values[layer]``, ``(batch, kv_heads, max_len,
    head_dim)``, of which the first :meth:`seq_len` positions are filled. Self-attention appends
    with :meth:`update`; cross-attention stores the projected encoder output once with
    :meth:`set` (use a separate cache for it).
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, max_len: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        _check_sizes(n_layers, batch_size, n_kv_heads, head_dim, max_len, dtype)
        shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = [0] * n_layers

    def __repr__(self) -> str:
        n_layers, batch, heads, max_len, head_dim = self.keys.shape
        return (f"KVCache(n_layers={n_layers}, batch_size={batch}, n_kv_heads={heads}, head_dim={head_dim}, "
                f"max_len={max_len}, filled={self.lengths[0]})")

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def max_len(self) -> int:
        """The most tokens a slot can hold."""
        return self.keys.shape[3]

    @property
    def memory_bytes(self) -> int:
        """Bytes allocated for keys and values: :func:`kv_cache_bytes` of ``max_len`` tokens."""
        return self.keys.nbytes + self.values.nbytes

    def _layer(self, layer: object) -> int:
        return _check_layer(layer, len(self.lengths))

    def seq_len(self, layer: int = 0) -> int:
        """Number of tokens stored in ``layer``'s slot (0 when empty)."""
        return self.lengths[self._layer(layer)]

    def get(self, layer: int) -> tuple[Tensor, Tensor] | None:
        """The stored ``(keys, values)`` of ``layer``, each ``(batch, kv_heads, seq_len, head_dim)``, or None."""
        n = self.lengths[self._layer(layer)]
        return None if n == 0 else (self.keys[layer, :, :, :n], self.values[layer, :, :, :n])

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``k``, ``v`` ``(batch, kv_heads, new, head_dim)`` to ``layer``; return all stored keys and values."""
        start = self.lengths[self._layer(layer)]
        _, batch, heads, _, head_dim = self.keys.shape
        _check_kv(k, v, batch, heads, head_dim)
        new = k.shape[2]
        end = start + new
        if end > self.max_len:
            raise ValueError(f"the KV cache holds max_len={self.max_len} tokens per layer; appending {new} "
                             f"to the {start} stored would need {end} (make a longer cache)")
        keys, values = self.keys[layer], self.values[layer]  # (batch, kv_heads, max_len, head_dim) views
        keys.narrow(2, start, new).copy_(k)  # in place: nothing old is copied
        values.narrow(2, start, new).copy_(v)
        self.lengths[layer] = end
        return keys.narrow(2, 0, end), values.narrow(2, 0, end)

    def set(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Overwrite ``layer``'s slot with ``k``, ``v`` (the cross-attention case); return them as stored."""
        self.lengths[self._layer(layer)] = 0
        return self.update(layer, k, v)

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` ``(new_batch,)`` (beam search: each beam continues a parent)."""
        if not isinstance(index, Tensor) or index.dim() != 1 or index.is_floating_point():
            raise ValueError(f"index must be a 1-D integer tensor of batch rows, got {index!r}")
        self.keys = self.keys.index_select(1, index.to(self.keys.device))
        self.values = self.values.index_select(1, index.to(self.values.device))

    def crop(self, n_tokens: int) -> None:
        """Keep only the first ``n_tokens`` of every slot (rewind; e.g. drop rejected draft tokens)."""
        check_length("n_tokens", n_tokens, minimum=0)
        self.lengths = [min(length, n_tokens) for length in self.lengths]

    def reset(self) -> None:
        """Empty every slot (start new sequences); the memory stays allocated."""
        self.lengths = [0] * len(self.lengths)


class StaticKVCache:
    """Keys and values in fixed-shape buffers, for a compiled decoding step.

    :class:`KVCache` attends over its first :meth:`~KVCache.seq_len` slots, a Python int that grows
    by one at every step: each step has new shapes, which a compiled step would be recompiled for,
    and which CUDA graphs cannot replay. Here a step writes its keys and values *at* the positions
    it is given (a LongTensor ``(new,)``, shared by the batch rows) and attention reads all
    ``max_len`` slots through :meth:`visible`, a mask that hides every slot after the query's
    position. Every shape is the same at every step, so one graph serves them all; the price is
    attending over ``max_len`` slots rather than the filled ones, which is small while the model's
    weights, read once per step, are most of the bytes a step moves.

    Args:
        n_layers, batch_size, n_kv_heads, head_dim, max_len, dtype, device: as :class:`KVCache`.

    ``keys[layer]`` and ``values[layer]`` are ``(batch, kv_heads, max_len, head_dim)``, one tensor
    per layer, marked as static addresses for ``torch.compile`` (a compiled step reads and writes
    them in place). Slots after the current position may hold an earlier sequence's values; the
    mask hides them, so a new sequence needs no reset.
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, head_dim: int, max_len: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        _check_sizes(n_layers, batch_size, n_kv_heads, head_dim, max_len, dtype)
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        for t in (*self.keys, *self.values):
            torch._dynamo.mark_static_address(t)
        self.slots = torch.arange(max_len, device=device)  # (max_len,): the key position of each slot

    def __repr__(self) -> str:
        batch, heads, max_len, head_dim = self.keys[0].shape
        return (f"StaticKVCache(n_layers={len(self)}, batch_size={batch}, n_kv_heads={heads}, head_dim={head_dim}, "
                f"max_len={max_len})")

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def max_len(self) -> int:
        """The most tokens a slot can hold."""
        return self.keys[0].shape[2]

    @property
    def memory_bytes(self) -> int:
        """Bytes allocated for keys and values: :func:`kv_cache_bytes` of ``max_len`` tokens."""
        return sum(t.nbytes for t in (*self.keys, *self.values))

    def update(self, layer: int, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k``, ``v`` ``(batch, kv_heads, new, head_dim)`` at ``positions`` ``(new,)``; return all slots.

        The returned keys and values are ``(batch, kv_heads, max_len, head_dim)``: attend over them
        with the mask :meth:`visible` of the same positions. Positions must lie in
        ``[0, max_len)``; they are not checked here (that would read them on the host, a sync at
        every step): :func:`companion.fast_generation.CompiledGenerator` checks the lengths once.
        """
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < len(self.keys):
            raise ValueError(f"layer must be an int in [0, {len(self.keys)}), got {layer!r}")
        batch, heads, _, head_dim = self.keys[layer].shape
        _check_kv(k, v, batch, heads, head_dim)
        if not isinstance(positions, Tensor) or positions.shape != (k.shape[2],) or positions.is_floating_point():
            got = tuple(positions.shape) if isinstance(positions, Tensor) else type(positions).__name__
            raise ValueError(f"positions must be an integer tensor of shape (new,)=({k.shape[2]},), got {got}")
        self.keys[layer].index_copy_(2, positions, k)  # in place, at the same address every step
        self.values[layer].index_copy_(2, positions, v)
        return self.keys[layer], self.values[layer]

    def visible(self, positions: Tensor) -> Tensor:
        """Bool mask ``(new, max_len)``: query ``i`` (at ``positions[i]``) may attend to the slots ``0 … positions[i]``.

        The causal mask of cached decoding, built from the positions' values instead of their count.
        """
        return self.slots <= positions[:, None]
