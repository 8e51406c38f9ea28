"""A small decoder-only (GPT-style) language model with a choice of positional scheme.

The architecture is nanoGPT's, cut to the bone::

    ids (batch, seq)
      -> token embedding                         (batch, seq, d_model)
      -> [+ absolute positions]                  "sinusoidal" | "learned"
      -> n_layers × pre-norm block:
             x = x + Attention(Norm(x))          causal; "rope" rotates q and k,
                                                 "alibi" | "t5" add a bias to the scores
             x = x + FFN(Norm(x))                Linear -> GELU -> Linear by default
      -> Norm -> Linear                          logits (batch, seq, vocab_size)

``position`` chooses where positional information enters (see :mod:`companion.positional`):
``"none"`` (the causal mask is the only source of order), ``"sinusoidal"`` and ``"learned"``
(added to the embeddings), ``"rope"`` (through the ``rotary`` hook of
:class:`companion.attention.MultiHeadAttention`), ``"alibi"`` and ``"t5"`` (through its ``bias``).
Everything else is identical across schemes, which is what Chapter 6's length-extrapolation
experiment needs. Every scheme except ``"learned"`` runs on sequences longer than it was trained
on; ``"learned"`` raises the ``ValueError`` of
:class:`companion.positional.LearnedPositionalEmbedding` beyond ``max_len``.

Each block is a :class:`companion.blocks.EncoderLayer` run with ``causal=True`` and
``norm_position="pre"`` — a GPT block is an encoder layer that cannot look ahead — so the
normalisation (``norm``) and feed-forward (``ffn``) choices of Chapters 7 and 8 are available too.
"""

from __future__ import annotations

from torch import Tensor, nn

from companion.blocks import EncoderLayer
from companion.normalization import make_norm
from companion.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    T5RelativePositionBias,
    alibi_bias,
)

__all__ = ["POSITIONS", "CausalLM"]

POSITIONS = ("none", "sinusoidal", "learned", "rope", "alibi", "t5")


class CausalLM(nn.Module):
    """A decoder-only language model: next-token logits for every position.

    Args:
        vocab_size: number of token ids.
        d_model, n_layers, n_heads: width, depth and heads (``d_model % n_heads == 0``).
        position: one of :data:`POSITIONS`.
        max_len: positions with a learned vector (``"learned"`` only; the others have no limit).
        mlp_ratio: hidden width of the feed-forward network as a multiple of ``d_model`` (4 in GPT).
        dropout: on the attention weights, inside the FFN and on each residual branch.
        norm: ``"layernorm"`` or ``"rmsnorm"`` (:mod:`companion.normalization`).
        ffn: ``"gelu"`` (GPT), ``"relu"``, ``"silu"`` or ``"swiglu"`` (:mod:`companion.feedforward`).
        t5_num_buckets, t5_max_distance: the T5 bucketing (causal, so one-sided).
        rope_base: RoPE's wavelength scale.
    """

    def __init__(self, vocab_size: int, d_model: int = 64, n_layers: int = 2, n_heads: int = 4, *,
                 position: str = "rope", max_len: int = 256, mlp_ratio: int = 4, dropout: float = 0.0,
                 t5_num_buckets: int = 32, t5_max_distance: int = 128, rope_base: float = 10000.0,
                 norm: str = "layernorm", ffn: str = "gelu") -> None:
        super().__init__()
        if position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
        for name, value in (("vocab_size", vocab_size), ("n_layers", n_layers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.position, self.n_heads = position, n_heads
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        # Absolute schemes add to the embeddings; relative ones act inside attention.
        self.pos_emb: nn.Module | None = None
        if position == "sinusoidal":
            self.pos_emb = SinusoidalPositionalEncoding(d_model, max_len)
        elif position == "learned":
            self.pos_emb = LearnedPositionalEmbedding(max_len, d_model)
        rotary = RotaryEmbedding(d_model // n_heads, base=rope_base) if position == "rope" else None
        # T5 learns one bias table and shares it across layers; ALiBi's bias is a formula.
        self.t5_bias = (T5RelativePositionBias(n_heads, t5_num_buckets, t5_max_distance, bidirectional=False)
                        if position == "t5" else None)
        self.blocks = nn.ModuleList(
            EncoderLayer(d_model, n_heads, mlp_ratio * d_model, dropout, norm_position="pre", norm=norm, ffn=ffn,
                         rotary=rotary)
            for _ in range(n_layers)
        )
        self.norm_f = make_norm(norm, d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def extra_repr(self) -> str:
        return f"position={self.position!r}"

    def attention_bias(self, seq: int) -> Tensor | None:
        """The additive score bias shared by all layers, ``(heads, seq, seq)``, or None."""
        if self.position == "alibi":
            return alibi_bias(self.n_heads, seq, causal=True, device=self.head.weight.device,
                              dtype=self.head.weight.dtype)
        if self.t5_bias is not None:
            return self.t5_bias(seq)
        return None

    def forward(self, ids: Tensor) -> Tensor:
        """Logits ``(batch, seq, vocab_size)`` for token ids ``(batch, seq)``; position ``t`` sees ids ``0..t``."""
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point():
            got = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
            raise ValueError(f"ids must be an integer tensor of shape (batch, seq), got {got}")
        x = self.tok_emb(ids)
        if self.pos_emb is not None:
            x = self.pos_emb(x)
        bias = self.attention_bias(ids.shape[1])
        for block in self.blocks:
            x = block(x, bias=bias, causal=True)
        return self.head(self.norm_f(x))
