"""The Transformer block, and the stack of blocks every model family is built from.

A :class:`Block` is self-attention, optionally cross-attention (its keys and values are the
encoder output, the "memory"), then the position-wise FFN; each is a residual sub-layer with a
normalisation (Vaswani et al., 2017, §3.1)::

    post-norm (the paper, BERT):  x = Norm(x + Dropout(f(x)))
    pre-norm  (GPT-2 on, T5):     x = x + Dropout(f(Norm(x)))

One block serves all three families: an encoder layer is a non-causal block, a decoder layer of
an encoder-decoder is a causal block with cross-attention, and a GPT block is a causal block
without it. A :class:`Stack` holds ``n`` blocks, the position scheme they share
(:class:`companion.positional.Positions`, built once per stack) and, for pre-norm, the final norm
(in pre-norm the residual stream itself is never normalised).

Every choice comes from one :class:`~companion.config.ModelConfig`: ``norm_position``, ``norm``,
``ffn``, ``position``, ``residual`` (False removes the skip connections, for Chapter 8).

Shapes: ``x`` / ``memory`` ``(batch, seq, d_model)``; masks are bool, True = may attend,
broadcastable to ``(batch, heads, q_len, k_len)`` (:mod:`companion.attention`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from companion.attention import KVCache, MultiHeadAttention, RollingKVCache, StaticKVCache
from companion.config import ModelConfig
from companion.feedforward import make_ffn
from companion.normalization import make_norm
from companion.positional import Positions, RotaryEmbedding

__all__ = ["Block", "Stack"]


def _norm(config: ModelConfig) -> nn.Module:
    return make_norm(config.norm, config.d_model, config.norm_eps, bias=config.bias)


def _attention(config: ModelConfig, layer_idx: int, rotary: RotaryEmbedding | None,
               sliding_window: int | None = None) -> MultiHeadAttention:
    return MultiHeadAttention(config.d_model, config.n_heads, config.n_kv_heads, config.dropout, config.bias,
                              head_dim=config.head_dim, scale=config.attention_scale, rotary=rotary,
                              layer_idx=layer_idx, sliding_window=sliding_window)


class Block(nn.Module):
    """Self-attention, optional cross-attention, FFN: each a residual sub-layer with a norm.

    Args:
        config: the model's :class:`~companion.config.ModelConfig`.
        cross_attention: add cross-attention to ``memory`` (the decoder of an encoder-decoder).
        layer_idx: this block's slot in a :class:`~companion.attention.KVCache`.
        rotary: the stack's RoPE hook (``Positions.rotary``), or None.
        sliding_window: keys seen by each query of the causal self-attention
            (``config.sliding_window`` in a decoder stack), or None; the block must then be called
            with ``causal=True``.

    After a call with ``need_weights=True`` the attention weights ``(batch, heads, q_len,
    k_len)`` are in :attr:`self_weights` and :attr:`cross_weights`.
    """

    def __init__(self, config: ModelConfig, *, cross_attention: bool = False, layer_idx: int = 0,
                 rotary: RotaryEmbedding | None = None,
                 sliding_window: int | None = None) -> None:
        super().__init__()
        self.pre, self.residual = config.norm_position == "pre", config.residual
        self.self_attn = _attention(config, layer_idx, rotary, sliding_window)
        self.self_norm = _norm(config)
        self.cross_attn = _attention(config, layer_idx, None) if cross_attention else None
        self.cross_norm = _norm(config) if cross_attention else None
        self.ffn = make_ffn(config)
        self.ffn_norm = _norm(config)
        self.drop = nn.Dropout(config.dropout)
        self.self_weights: Tensor | None = None
        self.cross_weights: Tensor | None = None

    def extra_repr(self) -> str:
        return f"norm_position={'pre' if self.pre else 'post'!r}, residual={self.residual}"

    def sublayer(self, x: Tensor, norm: nn.Module, f: Callable[[Tensor], Tensor]) -> Tensor:
        """``x + Drop(f(Norm(x)))`` (pre-norm) or ``Norm(x + Drop(f(x)))`` (post-norm); no ``x +`` without residuals."""
        if self.pre:
            y = self.drop(f(norm(x)))
            return x + y if self.residual else y
        y = self.drop(f(x))
        return norm(x + y if self.residual else y)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, bias: Tensor | None = None, causal: bool = False,
                positions: Tensor | None = None, cache: KVCache | None = None, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, cross_cache: KVCache | None = None,
                need_weights: bool = False) -> Tensor:
        """``x`` ``(batch, seq, d_model)`` -> same shape.

        Args:
            mask: bool mask of the self-attention (padding), combined with the causal one.
            bias: additive score bias of the self-attention (ALiBi, T5), ``(heads, q_len, k_len)``.
            causal: each position sees itself and the past only (decoders).
            positions: absolute positions of the tokens, for RoPE.
            cache: the self-attention :class:`~companion.attention.KVCache` (decoding).
            memory: the encoder output ``(batch, src_len, d_model)``, for cross-attention.
            memory_mask: bool mask over the memory's positions (source padding).
            cross_cache: a cache for the cross-attention's keys and values (computed once).
            need_weights: keep the attention weights (takes the explicit attention path).
        """

        def self_attention(h: Tensor) -> Tensor:
            out, self.self_weights = self.self_attn(h, mask=mask, bias=bias, cache=cache, need_weights=need_weights,
                                                    causal=causal, positions=positions)
            return out

        x = self.sublayer(x, self.self_norm, self_attention)
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("this block has cross-attention: pass memory= (the encoder output)")

            def cross_attention(h: Tensor) -> Tensor:
                out, self.cross_weights = self.cross_attn(h, context=memory, mask=memory_mask, cache=cross_cache,
                                                          need_weights=need_weights)
                return out

            x = self.sublayer(x, self.cross_norm, cross_attention)
        return self.sublayer(x, self.ffn_norm, self.ffn)


class Stack(nn.Module):
    """``n_layers`` :class:`Block` s sharing one position scheme, plus the final norm of pre-norm stacks.

    The stack adds absolute positions to its input (if the scheme has them), normalises the sum if
    ``config.embedding_norm`` (BERT), applies the embedding dropout, runs the blocks and the final
    norm. Positions continue from the cache:
    with ``t`` tokens cached, the new tokens are at ``t, t + 1, …``.

    Args:
        config: the model's :class:`~companion.config.ModelConfig`.
        n_layers: blocks in this stack.
        causal: a decoder stack (causal self-attention, causal ALiBi/T5 biases).
        cross_attention: its blocks attend to an encoder's output.
    """

    def __init__(self, config: ModelConfig, n_layers: int, *, causal: bool, cross_attention: bool = False) -> None:
        super().__init__()
        self.causal = causal
        self.positions = Positions(config, causal=causal)
        self.embedding_norm = _norm(config) if config.embedding_norm else None
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            Block(config, cross_attention=cross_attention, layer_idx=i, rotary=self.positions.rotary,
                  sliding_window=config.sliding_window if causal else None)  # encoders see the whole input
            for i in range(n_layers)
        )
        self.norm = _norm(config) if config.resolved_final_norm else None

    def forward(self, x: Tensor, *, mask: Tensor | None = None, positions: Tensor | None = None,
                cache: KVCache | StaticKVCache | None = None, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, cross_cache: KVCache | None = None,
                need_weights: bool = False) -> Tensor:
        """Embedded tokens ``x`` ``(batch, seq, d_model)`` -> hidden states, same shape.

        ``positions`` ``(seq,)`` or ``(batch, seq)`` default to ``past + arange(seq)``; the other
        arguments are passed to every :class:`Block`.
        """
        if isinstance(cache, StaticKVCache) and (positions is None or positions.dim() != 1):
            raise ValueError("a StaticKVCache needs positions of shape (seq,): where the new tokens go")
        if isinstance(cache, StaticKVCache) and self.positions.kind in ("alibi", "t5"):
            raise ValueError(f"a StaticKVCache does not support position={self.positions.kind!r} (its score bias "
                             "is built for the filled length); use a KVCache")
        if isinstance(cache, RollingKVCache) and self.positions.kind in ("alibi", "t5"):
            raise ValueError(f"a RollingKVCache does not support position={self.positions.kind!r} (its score bias "
                             "is indexed by key position, and the ring's slots are out of order); use a KVCache")
        past = cache.seq_len() if isinstance(cache, (KVCache, RollingKVCache)) else 0
        seq = x.shape[1]
        x = self.positions.add(x, positions, start=past)  # default positions: past, past + 1, …
        if positions is None and self.positions.rotary is not None:  # one tensor for every layer's RoPE
            positions = torch.arange(past, past + seq, device=x.device)
        if self.embedding_norm is not None:  # BERT normalises the summed embeddings
            x = self.embedding_norm(x)
        x = self.drop(x)
        bias = self.positions.bias(seq, past + seq, device=x.device, dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, mask=mask, bias=bias, causal=self.causal, positions=positions, cache=cache, memory=memory,
                      memory_mask=memory_mask, cross_cache=cross_cache, need_weights=need_weights)
        return x if self.norm is None else self.norm(x)

    def attention_weights(self, kind: str = "self") -> list[Tensor | None]:
        """Per block, the ``"self"`` or ``"cross"`` attention weights of the last ``need_weights=True`` call."""
        if kind not in ("self", "cross"):
            raise ValueError(f"kind must be 'self' or 'cross', got {kind!r}")
        return [layer.self_weights if kind == "self" else layer.cross_weights for layer in self.layers]
