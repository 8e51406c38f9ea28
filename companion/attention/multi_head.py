"""Multi-head attention: self-, cross-, grouped-query and multi-query (Vaswani et al., 2017, §3.2.2)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion.attention._checks import check_length, check_mask_and_bias, check_probability, check_scale, check_tensor
from companion.attention.functional import _sdpa, scaled_dot_product_attention
from companion.attention.kv_cache import KVCache, StaticKVCache
from companion.attention.local import sliding_window_attention
from companion.attention.masks import causal_mask, combine_masks, sliding_window_mask
from companion.attention.rolling_cache import RollingKVCache

__all__ = ["MultiHeadAttention"]

# A rotary hook: (x of shape (batch, heads, seq, head_dim), positions of shape (seq,) or (batch, seq))
# -> a tensor of the same shape as x. See MultiHeadAttention.
RotaryFn = Callable[[Tensor, Tensor], Tensor]


class MultiHeadAttention(nn.Module):
    """Multi-head attention: self-, cross-, grouped-query and multi-query (Vaswani et al., 2017, §3.2.2).

    ``head_i = Attention(X W_i^Q, Y W_i^K, Y W_i^V)`` and
    ``MultiHead(X, Y) = Concat(head_1, ..., head_h) W^O``, with ``Y = X`` for self-attention and
    ``Y = context`` (the encoder output) for cross-attention. Each head works in a
    ``head_dim = d_model / n_heads`` subspace, so h heads cost about what one full-width head costs.

    ``n_kv_heads`` (default ``n_heads``) sets how many key/value heads there are: each group of
    ``n_heads / n_kv_heads`` consecutive query heads shares one (GQA, Ainslie et al., 2023);
    ``n_kv_heads=1`` is multi-query attention (Shazeer, 2019). Only the keys and values shrink, and
    with them the KV cache, by ``n_heads / n_kv_heads``. Where PyTorch's fused kernel takes shared
    heads natively (its CPU kernel; on a GPU, FlashAttention in half precision without a mask), the
    fused path hands them over as they are (``enable_gqa``): nothing is copied. What a cached
    decoding step reads shrinks only where the kernel serves a group's query heads in one pass
    (FlashAttention's one-token path); the CPU kernel reads each shared head once per query head.
    Elsewhere, and in the explicit path (``need_weights=True``) and the sliding-window kernel, the
    shared heads are repeated per query head first.

    As in nanoGPT and ``torch.nn.MultiheadAttention``, W^Q, W^K, W^V are stacked in one
    ``in_proj`` Linear (rows: the ``n_heads`` query heads, then the keys, then the values), so
    self-attention projects with one matmul; ``out_proj`` is W^O.

    Args:
        d_model: model width.
        n_heads: query heads.
        n_kv_heads: key/value heads; must divide ``n_heads``. None = ``n_heads`` (plain MHA).
        dropout: dropout on the attention weights, active in training mode only.
        bias: whether the projections have biases.
        head_dim: per-head width; default ``d_model // n_heads`` (which must then divide).
        scale: factor on q·kᵀ; default ``1/sqrt(head_dim)`` (T5 uses 1.0).
        rotary: optional hook for rotary position embeddings (RoPE): a callable (or module)
            ``rotary(x, positions) -> x_rotated`` applied to the queries and the new keys after
            projection and before caching, with ``x`` of shape ``(batch, heads, seq, head_dim)``
            and ``positions`` a LongTensor ``(seq,)`` or ``(batch, seq)`` of absolute positions.
            Applied in self-attention only (positions of two different sequences do not compare).
        layer_idx: which slot of a :class:`KVCache` this layer uses.
        sliding_window: causal local attention (Mistral, Jiang et al., 2023): with ``causal=True``
            each query sees only the last ``sliding_window`` keys, itself included — query ``p``
            sees keys ``p − sliding_window + 1 … p`` (Hugging Face's ``sliding_window``). That is
            :func:`~companion.attention.sliding_window_mask` with ``window = sliding_window − 1``,
            whose ``window`` counts the keys *before* the query. Self-attention only; None = every
            earlier key.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, dropout: float = 0.0,
                 bias: bool = True, *, head_dim: int | None = None, scale: float | None = None,
                 rotary: RotaryFn | None = None, layer_idx: int = 0,
                 sliding_window: int | None = None) -> None:
        super().__init__()
        check_length("d_model", d_model)
        check_length("n_heads", n_heads)
        n_kv_heads = n_heads if n_kv_heads is None else check_length("n_kv_heads", n_kv_heads)
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(f"d_model must be divisible by n_heads, got d_model={d_model}, n_heads={n_heads}")
            head_dim = d_model // n_heads
        check_length("head_dim", head_dim)
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads must divide n_heads (each group of query heads shares one key/value "
                             f"head), got n_heads={n_heads}, n_kv_heads={n_kv_heads}")
        if rotary is not None and not callable(rotary):
            raise TypeError(f"rotary must be None or a callable (x, positions) -> x, got {type(rotary).__name__}")
        self.d_model, self.n_heads, self.n_kv_heads, self.head_dim = d_model, n_heads, n_kv_heads, head_dim
        self.dropout = check_probability("dropout", dropout)
        self.scale = check_scale(scale)
        self.rotary = rotary
        self.layer_idx = check_length("layer_idx", layer_idx, minimum=0)
        self.sliding_window = None if sliding_window is None else check_length("sliding_window", sliding_window)
        self.in_proj = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * head_dim, bias=bias)
        self.out_proj = nn.Linear(n_heads * head_dim, d_model, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections and zero biases, as ``torch.nn.MultiheadAttention``."""
        nn.init.xavier_uniform_(self.in_proj.weight)
        self.out_proj.reset_parameters()
        for lin in (self.in_proj, self.out_proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def extra_repr(self) -> str:
        window = f", sliding_window={self.sliding_window}" if self.sliding_window is not None else ""
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"head_dim={self.head_dim}, dropout={self.dropout}{window}")

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """The same attention as ``torch.nn.MultiheadAttention`` ``module``, weights copied.

        The result computes ``module(x, x, x)`` (with ``batch_first=True`` inputs) for
        ``self(x)``, and ``module(x, c, c)`` for ``self(x, context=c)``. Masks use the opposite
        convention: torch's ``attn_mask`` is True where attention is *not* allowed.
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}")
        if not module._qkv_same_embed_dim or module.bias_k is not None or module.add_zero_attn:
            raise ValueError("module must have kdim == vdim == embed_dim, no bias_k/bias_v and add_zero_attn=False")
        ours = cls(module.embed_dim, module.num_heads, dropout=module.dropout, bias=module.in_proj_bias is not None)
        ours.to(device=module.in_proj_weight.device, dtype=module.in_proj_weight.dtype)
        with torch.no_grad():
            ours.in_proj.weight.copy_(module.in_proj_weight)
            ours.out_proj.weight.copy_(module.out_proj.weight)
            if module.in_proj_bias is not None:
                ours.in_proj.bias.copy_(module.in_proj_bias)
                ours.out_proj.bias.copy_(module.out_proj.bias)
        return ours

    def _split_heads(self, t: Tensor, heads: int) -> Tensor:
        # (batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim); a view, no copy
        return t.view(t.shape[0], t.shape[1], heads, self.head_dim).transpose(1, 2)

    def _repeat_kv(self, t: Tensor) -> Tensor:
        # (batch, kv_heads, seq, head_dim) -> (batch, heads, seq, head_dim): query head i uses kv head
        # i // group, i.e. consecutive query heads form a group.
        group = self.n_heads // self.n_kv_heads
        if group == 1:
            return t
        b, hkv, s, d = t.shape
        return t[:, :, None].expand(b, hkv, group, s, d).reshape(b, hkv * group, s, d)

    def _check_inputs(self, x: Tensor, context: Tensor | None, cache: KVCache | None, causal: bool) -> None:
        check_tensor("x", x)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, seq, d_model={self.d_model}), got {tuple(x.shape)}")
        if context is not None:
            check_tensor("context", context)
            if context.dim() != 3 or context.shape[-1] != self.d_model or context.shape[0] != x.shape[0]:
                raise ValueError(f"context must have shape (batch={x.shape[0]}, k_len, d_model={self.d_model}), "
                                 f"got {tuple(context.shape)}")
        if cache is not None and not isinstance(cache, (KVCache, StaticKVCache, RollingKVCache)):
            raise TypeError(f"cache must be a KVCache, a StaticKVCache, a RollingKVCache or None, "
                            f"got {type(cache).__name__}")
        if isinstance(cache, RollingKVCache) and (self.sliding_window is None or context is not None
                                                  or cache.window != self.sliding_window - 1):
            raise ValueError(f"a RollingKVCache serves sliding-window self-attention with window = sliding_window - 1 "
                             f"(this layer: sliding_window={self.sliding_window}), got one with window={cache.window}")
        if isinstance(cache, StaticKVCache) and context is not None:
            raise TypeError("a StaticKVCache serves self-attention only; cache cross-attention with a KVCache")
        if self.sliding_window is not None and (context is not None or not causal):
            raise ValueError(f"this layer has sliding_window={self.sliding_window} (causal local self-attention): "
                             "call it with causal=True and no context")

    def forward(self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None, bias: Tensor | None = None,
                cache: KVCache | StaticKVCache | RollingKVCache | None = None, need_weights: bool = False, *,
                causal: bool = False,
                positions: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` to itself (or to ``context``).

        Args:
            x: ``(batch, q_len, d_model)``, the queries' sequence.
            context: ``(batch, k_len, d_model)`` for cross-attention; None for self-attention.
            mask: bool, True = may attend, broadcastable to ``(batch, heads, q_len, k_len)``, where
                ``k_len`` counts cached tokens too (:func:`~companion.attention.padding_mask`,
                :func:`~companion.attention.causal_mask`).
            bias: additive float bias broadcastable to ``(batch, heads, q_len, k_len)``.
            cache: a :class:`KVCache`. In self-attention this layer appends its new keys and
                values to slot ``layer_idx`` and attends over all of them; in cross-attention the
                projected ``context`` is stored at the first call and reused afterwards. Or a
                :class:`StaticKVCache` (self-attention; ``positions`` ``(q_len,)`` required): the new
                keys and values are written at ``positions`` and the query attends over every
                slot up to its own position. Or, with ``sliding_window``, a
                :class:`~companion.attention.RollingKVCache` of ``window = sliding_window - 1``:
                only the last ``sliding_window`` tokens are kept (memory O(sliding_window)).
            need_weights: also return the per-head weights ``(batch, heads, q_len, k_len)``;
                this takes the explicit path. Otherwise the fused kernel runs (same output to
                ~1e-6 in fp32).
            causal: add the causal mask (offset by the cached length), so callers need not build it;
                with ``sliding_window``, the sliding-window mask instead. A whole sequence with no
                mask, bias, weights or dropout then runs the chunked local kernel
                (:func:`~companion.attention.sliding_window_attention`), whose memory grows as
                ``q_len · sliding_window``, not ``q_len²``.
            positions: absolute positions of the ``q_len`` new tokens for the ``rotary`` hook,
                ``(q_len,)`` or ``(batch, q_len)``; default ``cached + arange(q_len)``. Fractional
                positions are allowed (RoPE position interpolation divides them).

        Returns:
            ``(output, weights)``: output ``(batch, q_len, d_model)``; weights as above or None.
        """
        self._check_inputs(x, context, cache, causal)
        h, hkv, d = self.n_heads, self.n_kv_heads, self.head_dim
        q_rows, kv_rows = h * d, hkv * d
        batch, q_len, _ = x.shape

        if context is None:  # self-attention: one matmul for q, k and v
            q, k, v = self.in_proj(x).split([q_rows, kv_rows, kv_rows], dim=-1)
            q, k, v = self._split_heads(q, h), self._split_heads(k, hkv), self._split_heads(v, hkv)
            if isinstance(cache, StaticKVCache):  # fixed shapes: written at positions, masked by them
                if positions is None:
                    raise ValueError("a StaticKVCache needs positions: the new tokens' positions, (q_len,)")
                if self.rotary is not None:
                    q, k = self.rotary(q, positions), self.rotary(k, positions)
                k, v = cache.update(self.layer_idx, k, v, positions)
                visible = cache.visible(positions)  # (q_len, max_len): slots up to each query's position
                if self.sliding_window is not None:
                    visible = visible & (cache.slots > positions[:, None] - self.sliding_window)
                mask, causal = combine_masks(mask, visible), False
            else:
                if self.rotary is not None:
                    past = cache.seq_len(self.layer_idx) if cache is not None else 0
                    pos = self._positions(positions, batch, q_len, past, x.device)
                    q, k = self.rotary(q, pos), self.rotary(k, pos)
                if cache is not None:
                    k, v = cache.update(self.layer_idx, k, v)
        else:  # cross-attention: queries from x, keys/values from context (computed once if cached)
            w_q, w_kv = self.in_proj.weight.split([q_rows, 2 * kv_rows])
            b_q, b_kv = (None, None) if self.in_proj.bias is None else self.in_proj.bias.split([q_rows, 2 * kv_rows])
            q = self._split_heads(F.linear(x, w_q, b_q), h)
            stored = cache.get(self.layer_idx) if cache is not None else None
            if stored is None:
                k, v = F.linear(context, w_kv, b_kv).split([kv_rows, kv_rows], dim=-1)
                k, v = self._split_heads(k, hkv), self._split_heads(v, hkv)
                if cache is not None:
                    k, v = cache.set(self.layer_idx, k, v)
            else:
                k, v = stored
        k_len = k.shape[-2]

        check_mask_and_bias(mask, bias, (batch, h, q_len, k_len))
        dropout_p = self.dropout if self.training else 0.0
        is_causal = local = False
        if causal and self.sliding_window is not None:  # query p sees keys p - sliding_window + 1 ... p
            plain = mask is None and bias is None and q_len == k_len and not need_weights
            if plain and q_len <= self.sliding_window:
                is_causal = True  # the window reaches back to the first token: plain causal attention
            elif plain and dropout_p == 0.0:
                local = True  # the chunked kernel: O(q_len · sliding_window) memory, no (q_len, k_len) mask
            else:
                window = sliding_window_mask(q_len, k_len, self.sliding_window - 1, device=x.device)
                mask = combine_masks(mask, window)
        elif causal:
            if mask is None and bias is None and q_len == k_len and not need_weights:
                is_causal = True  # let the fused kernel mask (and skip) the upper triangle itself
            elif q_len > 1:  # one new query sees every cached key: nothing to mask
                mask = combine_masks(mask, causal_mask(q_len, k_len, device=x.device))

        if local:
            out = sliding_window_attention(q, self._repeat_kv(k), self._repeat_kv(v), self.sliding_window - 1,
                                           causal=True, scale=self.scale)
            weights = None
        elif need_weights:
            out, weights = scaled_dot_product_attention(q, self._repeat_kv(k), self._repeat_kv(v), mask, bias,
                                                        dropout_p, scale=self.scale)
        else:
            # grouped heads go to the kernel as they are where PyTorch reads them natively (its CPU kernel; on a
            # GPU, FlashAttention: half precision, no mask or bias); elsewhere its math fallback would build
            # the (q_len, k_len) scores, so the memory-efficient kernel gets an h / h_kv-fold copy instead
            half = q.dtype in (torch.float16, torch.bfloat16)
            native = self.n_kv_heads < self.n_heads and (
                q.device.type == "cpu" or (q.device.type == "cuda" and mask is None and bias is None and half))
            if not native:
                k, v = self._repeat_kv(k), self._repeat_kv(v)
            out = _sdpa(q, k, v, mask, bias, dropout_p, self.scale, is_causal, enable_gqa=native)
            weights = None
        out = out.transpose(1, 2).reshape(batch, q_len, h * d)  # concatenate the heads
        return self.out_proj(out), weights

    def _positions(self, positions: Tensor | None, batch: int, q_len: int, past: int, device: torch.device) -> Tensor:
        if positions is None:
            return torch.arange(past, past + q_len, device=device)
        if not isinstance(positions, Tensor) or positions.is_complex() or positions.dtype == torch.bool:
            got = getattr(positions, "dtype", type(positions).__name__)
            raise TypeError(f"positions must be a real-valued tensor (integer, or fractional for RoPE position "
                            f"interpolation), got {got}")
        if tuple(positions.shape) not in ((q_len,), (batch, q_len)):
            raise ValueError(f"positions must have shape (q_len,)=({q_len},) or (batch, q_len)=({batch}, {q_len}), "
                             f"got {tuple(positions.shape)}")
        return positions
