"""Encoder and decoder layers, and the stacks built from them (Vaswani et al., 2017, §3.1).

An encoder layer is two sub-layers, each wrapped in a residual connection and a normalisation::

    post-norm (the paper):  x = Norm(x + Dropout(SelfAttn(x)));   x = Norm(x + Dropout(FFN(x)))
    pre-norm  (GPT-2 on):   x = x + Dropout(SelfAttn(Norm(x)));   x = x + Dropout(FFN(Norm(x)))

A decoder layer has three: masked (causal) self-attention, cross-attention whose keys and values
are the encoder output ("memory"), and the FFN. In pre-norm the residual stream is never
normalised, so the stacks end with one final norm; post-norm stacks need none (the last layer
already normalised), but ``final_norm=True`` adds one, as ``torch.nn.Transformer`` does.

Every choice the chapters compare is an argument: ``norm_position`` ("pre" | "post"), ``norm``
("layernorm" | "rmsnorm"), ``ffn`` ("relu" | "gelu" | "swiglu"), ``residual`` (False removes the
skip connections, for Chapter 8's gradient experiment) and, at the stack level, a relative
``position`` scheme applied inside attention ("none" | "rope" | "alibi"; absolute schemes are
added to the embeddings by the model, see :mod:`companion.models.transformer`).

Shapes: ``x`` / ``memory`` ``(batch, seq, d_model)``; masks are bool, True = may attend,
broadcastable to ``(batch, heads, q_len, k_len)`` (:mod:`companion.attention`).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from companion._validation import check_choice, check_int
from companion.attention import MultiHeadAttention
from companion.feedforward import ACTIVATIONS, FeedForward, SwiGLU
from companion.normalization import NORMS, make_norm
from companion.positional import RotaryEmbedding, alibi_bias

__all__ = ["NORM_POSITIONS", "FFN_KINDS", "STACK_POSITIONS", "make_ffn", "EncoderLayer", "DecoderLayer",
           "TransformerEncoder", "TransformerDecoder"]

NORM_POSITIONS = ("pre", "post")
FFN_KINDS = (*ACTIVATIONS, "swiglu")
STACK_POSITIONS = ("none", "rope", "alibi")






def make_ffn(kind: str, d_model: int, d_ff: int, dropout: float = 0.0) -> nn.Module:
    """A position-wise FFN: ``FeedForward(d_model, d_ff, kind)`` or, for ``"swiglu"``, ``SwiGLU(d_model, d_ff)``.

    ``d_ff`` is used as given for every kind; pass
    :func:`companion.feedforward.matching_swiglu_hidden_size` for a SwiGLU of equal size.
    """
    check_choice("ffn", kind, FFN_KINDS)
    if kind == "swiglu":
        return SwiGLU(d_model, d_ff, dropout=dropout)
    return FeedForward(d_model, d_ff, kind, dropout=dropout)


class _Sublayer(nn.Module):
    """A residual sub-layer: ``Norm(x + Drop(f(x)))`` (post) or ``x + Drop(f(Norm(x)))`` (pre)."""

    def __init__(self, d_model: int, norm: str, norm_position: str, dropout: float, residual: bool) -> None:
        super().__init__()
        self.norm = make_norm(norm, d_model)
        self.pre = norm_position == "pre"
        self.residual = residual
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, f: Callable[[Tensor], Tensor]) -> Tensor:
        # f is the sub-layer, (batch, seq, d_model) -> (batch, seq, d_model)
        if self.pre:
            y = self.drop(f(self.norm(x)))
            return x + y if self.residual else y
        y = self.drop(f(x))
        return self.norm(x + y if self.residual else y)


class EncoderLayer(nn.Module):
    """Self-attention then FFN, each with a residual connection and a norm (Vaswani et al., 2017, §3.1).

    Args:
        d_model, n_heads: width and attention heads.
        d_ff: FFN hidden width.
        dropout: on the attention weights, inside the FFN, and on each sub-layer output before
            the residual sum (the paper's "residual dropout", P_drop = 0.1).
        norm_position: ``"post"`` (the paper) or ``"pre"``.
        norm: ``"layernorm"`` or ``"rmsnorm"``.
        ffn: ``"relu"``, ``"gelu"``, ``"silu"`` or ``"swiglu"``.
        residual: keep the skip connections (False only for experiments).
        rotary: optional RoPE hook for the self-attention.
        n_kv_heads: key/value heads (GQA/MQA); default ``n_heads``.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, *, norm_position: str = "post",
                 norm: str = "layernorm", ffn: str = "relu", residual: bool = True,
                 rotary: RotaryEmbedding | None = None, n_kv_heads: int | None = None) -> None:
        super().__init__()
        check_choice("norm_position", norm_position, NORM_POSITIONS)
        check_choice("norm", norm, NORMS)
        self.d_model, self.norm_position = check_int("d_model", d_model), norm_position
        self.self_attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, dropout=dropout, rotary=rotary)
        self.ffn = make_ffn(ffn, d_model, d_ff, dropout)
        self.attn_block = _Sublayer(d_model, norm, norm_position, dropout, residual)
        self.ffn_block = _Sublayer(d_model, norm, norm_position, dropout, residual)

    def extra_repr(self) -> str:
        return f"norm_position={self.norm_position!r}"

    def forward(self, x: Tensor, mask: Tensor | None = None, bias: Tensor | None = None,
                causal: bool = False) -> Tensor:
        """``x`` ``(batch, src_len, d_model)`` -> same shape.

        ``mask``: bool, True = may attend, e.g. :func:`companion.attention.padding_mask` of the
        source ``(batch, 1, 1, src_len)``. ``bias``: additive score bias (ALiBi, T5).
        ``causal=True`` makes each position attend only to itself and earlier ones, which turns
        the layer into a decoder-only (GPT) block (see :mod:`companion.models.causal_lm`).
        """
        x = self.attn_block(x, lambda h: self.self_attn(h, mask=mask, bias=bias, causal=causal)[0])
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder output, then FFN (Vaswani et al., 2017, §3.1).

    Same arguments as :class:`EncoderLayer`. The self-attention is causal (position ``t`` sees
    target positions ``<= t``); the cross-attention takes its queries from the decoder and its
    keys and values from ``memory``, the encoder output.

    After a call with ``need_weights=True`` the cross-attention weights
    ``(batch, heads, tgt_len, src_len)`` are in :attr:`cross_weights`.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, *, norm_position: str = "post",
                 norm: str = "layernorm", ffn: str = "relu", residual: bool = True,
                 rotary: RotaryEmbedding | None = None, n_kv_heads: int | None = None) -> None:
        super().__init__()
        check_choice("norm_position", norm_position, NORM_POSITIONS)
        check_choice("norm", norm, NORMS)
        self.d_model, self.norm_position = check_int("d_model", d_model), norm_position
        self.self_attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, dropout=dropout, rotary=rotary)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, dropout=dropout)
        self.ffn = make_ffn(ffn, d_model, d_ff, dropout)
        self.self_block = _Sublayer(d_model, norm, norm_position, dropout, residual)
        self.cross_block = _Sublayer(d_model, norm, norm_position, dropout, residual)
        self.ffn_block = _Sublayer(d_model, norm, norm_position, dropout, residual)
        self.cross_weights: Tensor | None = None

    def extra_repr(self) -> str:
        return f"norm_position={self.norm_position!r}"

    def forward(self, x: Tensor, memory: Tensor, self_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                self_bias: Tensor | None = None, need_weights: bool = False) -> Tensor:
        """``x`` ``(batch, tgt_len, d_model)``, ``memory`` ``(batch, src_len, d_model)`` -> ``(batch, tgt_len, d_model)``.

        ``self_mask``: extra bool mask for the self-attention (e.g. target padding), combined with
        the causal mask. ``memory_mask``: bool mask on the source keys (source padding).
        ``self_bias``: additive score bias for the self-attention (causal ALiBi).
        """
        if memory.shape[0] != x.shape[0]:
            raise ValueError(f"memory batch size {memory.shape[0]} (shape {tuple(memory.shape)}) differs from the "
                             f"target batch size {x.shape[0]} (shape {tuple(x.shape)})")
        x = self.self_block(x, lambda h: self.self_attn(h, mask=self_mask, bias=self_bias, causal=True)[0])

        def cross(h: Tensor) -> Tensor:
            out, self.cross_weights = self.cross_attn(h, context=memory, mask=memory_mask, need_weights=need_weights)
            return out

        x = self.cross_block(x, cross)
        return self.ffn_block(x, self.ffn)


class _Stack(nn.Module):
    def __init__(self, layer_cls, n_layers: int, d_model: int, n_heads: int, d_ff: int, dropout: float,
                 norm_position: str, norm: str, ffn: str, position: str, residual: bool, final_norm: bool | None,
                 n_kv_heads: int | None) -> None:
        super().__init__()
        check_int("n_layers", n_layers)
        check_choice("norm_position", norm_position, NORM_POSITIONS)
        check_choice("norm", norm, NORMS)
        check_choice("position", position, STACK_POSITIONS)
        check_int("d_model", d_model)
        check_int("n_heads", n_heads)
        if d_model % n_heads:
            raise ValueError(f"d_model must be divisible by n_heads, got d_model={d_model}, n_heads={n_heads}")
        self.position, self.n_heads, self.norm_position = position, n_heads, norm_position
        rotary = RotaryEmbedding(d_model // n_heads) if position == "rope" else None
        self.layers = nn.ModuleList(
            layer_cls(d_model, n_heads, d_ff, dropout, norm_position=norm_position, norm=norm, ffn=ffn,
                      residual=residual, rotary=rotary, n_kv_heads=n_kv_heads)
            for _ in range(n_layers)
        )
        final_norm = norm_position == "pre" if final_norm is None else final_norm
        self.norm = make_norm(norm, d_model) if final_norm else None

    def _check_x(self, name: str, x: object) -> Tensor:
        d_model = self.layers[0].d_model
        if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() != 3 or x.shape[-1] != d_model:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name} must be a float tensor of shape (batch, seq, d_model={d_model}), got {got}")
        return x


class TransformerEncoder(_Stack):
    """``n_layers`` :class:`EncoderLayer` s, plus a final norm for pre-norm stacks.

    Args:
        n_layers: depth (6 in the paper). Other arguments: see :class:`EncoderLayer`.
        position: relative position scheme inside attention: ``"none"`` (positions, if any,
            were added to the input), ``"rope"`` or ``"alibi"`` (symmetric, non-causal).
        final_norm: add a norm after the last layer; default True for pre-norm, False for post-norm.
    """

    def __init__(self, n_layers: int, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, *,
                 norm_position: str = "post", norm: str = "layernorm", ffn: str = "relu", position: str = "none",
                 residual: bool = True, final_norm: bool | None = None, n_kv_heads: int | None = None) -> None:
        super().__init__(EncoderLayer, n_layers, d_model, n_heads, d_ff, dropout, norm_position, norm, ffn, position,
                         residual, final_norm, n_kv_heads)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x`` ``(batch, src_len, d_model)`` -> memory ``(batch, src_len, d_model)``; ``mask`` as in :class:`EncoderLayer`."""
        self._check_x("x", x)
        bias = None
        if self.position == "alibi":
            bias = alibi_bias(self.n_heads, x.shape[1], causal=False, device=x.device, dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, mask=mask, bias=bias)
        return x if self.norm is None else self.norm(x)


class TransformerDecoder(_Stack):
    """``n_layers`` :class:`DecoderLayer` s, plus a final norm for pre-norm stacks.

    Arguments as :class:`TransformerEncoder`; ``"alibi"`` here is the causal variant.
    """

    def __init__(self, n_layers: int, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, *,
                 norm_position: str = "post", norm: str = "layernorm", ffn: str = "relu", position: str = "none",
                 residual: bool = True, final_norm: bool | None = None, n_kv_heads: int | None = None) -> None:
        super().__init__(DecoderLayer, n_layers, d_model, n_heads, d_ff, dropout, norm_position, norm, ffn, position,
                         residual, final_norm, n_kv_heads)

    def forward(self, x: Tensor, memory: Tensor, self_mask: Tensor | None = None, memory_mask: Tensor | None = None,
                need_weights: bool = False) -> Tensor:
        """``x`` ``(batch, tgt_len, d_model)`` attending to ``memory`` ``(batch, src_len, d_model)`` -> ``(batch, tgt_len, d_model)``.

        With ``need_weights=True`` every layer keeps its cross-attention weights in
        ``layer.cross_weights`` (see :meth:`cross_attention_weights`).
        """
        self._check_x("x", x)
        self._check_x("memory", memory)
        if memory.shape[0] != x.shape[0]:
            raise ValueError(f"memory batch size {memory.shape[0]} differs from the target batch size {x.shape[0]}")
        bias = None
        if self.position == "alibi":
            bias = alibi_bias(self.n_heads, x.shape[1], causal=True, device=x.device, dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask, self_bias=bias,
                      need_weights=need_weights)
        return x if self.norm is None else self.norm(x)

    def cross_attention_weights(self) -> list[Tensor | None]:
        """Per layer, the cross-attention weights ``(batch, heads, tgt_len, src_len)`` of the last call with ``need_weights=True``."""
        return [layer.cross_weights for layer in self.layers]
