"""One configuration for every model in the book: :class:`ModelConfig`.

A Transformer is a handful of choices — widths, depth, where positional information enters, which
normalisation sits where, which feed-forward network — and every model family of the book (the
original encoder-decoder, GPT, BERT, T5) is a setting of the same choices on the same parts
(:mod:`companion.blocks`). So every model is built from one dataclass, validated once when it is
created: a bad value raises a ``ValueError`` naming the field, before any module exists::

    config = ModelConfig.preset("gpt2-small")              # GPT-2's published size
    config = ModelConfig.preset("tiny", position="rope")   # a CPU-sized model, RoPE instead
    model = GPT(config)

Sizes follow the book's names: ``d_model`` (width), ``n_heads`` and ``n_kv_heads`` (query and
key/value heads), ``head_dim`` (per-head width, ``d_model / n_heads`` unless set), ``d_ff`` (the
FFN's hidden width), ``max_len`` (longest sequence with a learned position; the KV cache's
default length).

Two fields serve long sequences (Chapter 14): ``sliding_window`` limits each query of a decoder
to its last ``sliding_window`` keys (Mistral's local attention), and ``rope_scaling`` stretches
RoPE beyond the length it was trained on (:class:`RopeScaling`)::

    config = ModelConfig.preset("llama-tiny", sliding_window=64, rope_scaling={"rope_type": "linear", "factor": 4})
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["POSITIONS", "NORMS", "NORM_POSITIONS", "FFNS", "ROPE_TYPES", "RopeScaling", "ModelConfig"]

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "t5", "none")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
FFNS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu")
ROPE_TYPES = ("linear", "dynamic")


@dataclass(frozen=True)
class RopeScaling:
    """How RoPE reaches positions beyond ``max_len``, the length it was trained on.

    Written as Hugging Face writes it, ``{"rope_type": ..., "factor": ...}``, which
    :class:`ModelConfig` turns into this frozen (hashable) form. Both kinds are implemented in
    :class:`companion.positional.RotaryEmbedding`:

    * ``"linear"`` — position interpolation (Chen et al., 2023): positions are divided by
      ``factor``, so ``factor · max_len`` positions span the angles that ``max_len`` did.
    * ``"dynamic"`` — dynamic NTK scaling: up to ``max_len`` tokens RoPE is unchanged; a longer
      sequence of ``seq`` tokens rotates with the larger base
      ``base · (factor · seq / max_len − (factor − 1))^(head_dim / (head_dim − 2))``.

    Args:
        rope_type: ``"linear"`` or ``"dynamic"``.
        factor: the stretch, ``>= 1``.
    """

    rope_type: str
    factor: float

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_scaling's rope_type must be one of {ROPE_TYPES}, got {self.rope_type!r}")
        factor = self.factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 <= factor < math.inf:
            raise ValueError(f"rope_scaling's factor must be a finite number >= 1, got {factor!r}")
        object.__setattr__(self, "factor", float(factor))


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of a model: sizes and the choices the chapters compare.

    Sizes:
        vocab_size: token ids ``0 … vocab_size − 1`` (the source vocabulary of an
            encoder-decoder).
        tgt_vocab_size: the target vocabulary of an encoder-decoder; None = ``vocab_size``.
        d_model: width of the residual stream.
        n_layers: blocks (the encoder's, in an encoder-decoder).
        n_decoder_layers: decoder blocks of an encoder-decoder; None = ``n_layers``.
        n_heads: query heads.
        n_kv_heads: key/value heads (GQA; 1 = multi-query); None = ``n_heads``.
        head_dim: per-head width; None = ``d_model // n_heads`` (which must then divide).
        d_ff: FFN hidden width; None = ``4 · d_model``, or ``8/3 · d_model`` rounded up to a
            multiple of 8 for the gated FFNs (equal parameters).
        max_len: positions with a learned vector; the default length of a KV cache.

    Choices:
        position: ``"learned"`` (GPT-2, BERT), ``"sinusoidal"`` (the original Transformer) —
            both added to the embeddings — ``"rope"`` (rotates queries and keys), ``"alibi"``,
            ``"t5"`` (biases on the attention scores) or ``"none"``.
        norm: ``"layernorm"`` or ``"rmsnorm"``; ``norm_eps`` its ε.
        norm_position: ``"pre"`` (GPT-2 on) or ``"post"`` (the original Transformer, BERT).
        final_norm: a norm after the last block; None = only for pre-norm.
        ffn: ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` (GPT-2's approximation), ``"silu"``, or the
            gated ``"swiglu"`` (LLaMA) and ``"geglu"`` (T5 v1.1, with tanh-GELU).
        bias: biases in the attention and FFN projections.
        tie_embeddings: the output projection is the (target) token embedding matrix.
        scale_embeddings: multiply token embeddings by ``√d_model`` (the original Transformer).
        dropout: on embeddings, attention weights and every residual branch, and on the FFN's
            hidden units unless ``ffn_dropout`` says otherwise.
        ffn_dropout: dropout on the FFN's hidden units; None = ``dropout`` (T5, the book's small
            models). BERT, GPT-2 and the original Transformer have none there (0.0 in their
            presets): their FFN output is dropped as a residual branch only.
        residual: keep the skip connections (False only for Chapter 8's experiment).
        attention_scale: factor on ``q·kᵀ``; None = ``1/√head_dim`` (T5 uses 1.0).
        rope_base: RoPE's wavelength scale θ.
        rope_scaling: None, or how RoPE stretches beyond ``max_len``: a :class:`RopeScaling` or
            the dict ``{"rope_type": "linear" | "dynamic", "factor": f}`` (stored as a
            :class:`RopeScaling`); needs ``position="rope"``.
        sliding_window: None (full attention), or the number of keys each query of a causal
            (decoder) self-attention sees: itself and the ``sliding_window − 1`` before it, i.e.
            query ``p`` sees keys ``p − sliding_window + 1 … p``. This is Hugging Face Mistral's
            ``sliding_window`` (key ``j`` is seen when ``p − j < sliding_window``), and
            :func:`companion.attention.sliding_window_mask` with ``window = sliding_window − 1``
            (whose ``window`` counts the keys *before* the query). Encoders ignore it.
        t5_num_buckets, t5_max_distance: T5's relative-position buckets.
        init_std: standard deviation of the normal initialisation of projections and
            embeddings (GPT-2, BERT, LLaMA: 0.02); None keeps PyTorch's defaults. Note that with
            ``position="sinusoidal"`` the unit-scale sinusoids swamp embeddings of std 0.02: use
            ``scale_embeddings=True`` (as the original Transformer does) or ``init_std=None``.
        residual_init_scale: with ``init_std``, draw the projections that write into the
            residual stream with std ``init_std / √(2 · n_layers)`` (GPT-2, Radford et al. 2019,
            §2.3); False draws them at ``init_std`` like every other matrix (BERT and Hugging
            Face's LLaMA: False in their presets).
        pad_id: the padding id (masked in the source of an encoder-decoder, ignored by losses).
        embedding_norm: normalise the summed embeddings before the first block (BERT).
        type_vocab_size: segment ("token type") embeddings, e.g. 2 for BERT's sentence A / B;
            0 for none.
    """

    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None
    head_dim: int | None = None
    d_ff: int | None = None
    max_len: int = 256
    tgt_vocab_size: int | None = None
    n_decoder_layers: int | None = None
    position: str = "learned"
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_position: str = "pre"
    final_norm: bool | None = None
    ffn: str = "gelu"
    bias: bool = True
    tie_embeddings: bool = True
    scale_embeddings: bool = False
    dropout: float = 0.0
    residual: bool = True
    attention_scale: float | None = None
    rope_base: float = 10000.0
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    init_std: float | None = 0.02
    residual_init_scale: bool = True
    pad_id: int = 0
    embedding_norm: bool = False
    type_vocab_size: int = 0
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None
    ffn_dropout: float | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_len", "t5_num_buckets", "t5_max_distance"):
            _positive_int(name, getattr(self, name))
        for name in ("n_kv_heads", "head_dim", "d_ff", "tgt_vocab_size", "n_decoder_layers", "sliding_window"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        for name, choices in (("position", POSITIONS), ("norm", NORMS), ("norm_position", NORM_POSITIONS),
                              ("ffn", FFNS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        for name in ("bias", "tie_embeddings", "scale_embeddings", "residual", "embedding_norm", "residual_init_scale"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        segments = self.type_vocab_size
        if isinstance(segments, bool) or not isinstance(segments, int) or segments < 0:
            raise ValueError(f"type_vocab_size must be an int >= 0, got {self.type_vocab_size!r}")
        if self.final_norm is not None and not isinstance(self.final_norm, bool):
            raise ValueError(f"final_norm must be a bool or None, got {self.final_norm!r}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(f"n_heads must divide d_model (or set head_dim), got d_model={self.d_model}, "
                             f"n_heads={self.n_heads}")
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads must divide n_heads (each group of query heads shares a key/value head), "
                             f"got n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}")
        if self.position == "rope" and self.resolved_head_dim % 2:
            raise ValueError(f"head_dim must be even for position='rope' (features rotate in pairs), "
                             f"got {self.resolved_head_dim}")
        if self.position == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"d_model must be even for position='sinusoidal', got {self.d_model}")
        for name in ("dropout", "ffn_dropout"):
            value = getattr(self, name)
            if name == "ffn_dropout" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"{name} must be a float in [0, 1), got {value!r}")
        for name in ("norm_eps", "rope_base"):
            _positive_float(name, getattr(self, name))
        for name in ("attention_scale", "init_std"):
            if getattr(self, name) is not None:
                _positive_float(name, getattr(self, name))
        if isinstance(self.pad_id, bool) or not isinstance(self.pad_id, int) or not 0 <= self.pad_id < min(
                self.vocab_size, self.tgt_vocab_size or self.vocab_size):
            raise ValueError(f"pad_id must be an id of the vocabulary (and of the target one), got {self.pad_id!r}")
        if self.position == "t5" and (self.t5_num_buckets < 4 or self.t5_max_distance <= self.t5_num_buckets // 2):
            raise ValueError(f"t5_num_buckets must be >= 4 and t5_max_distance must exceed t5_num_buckets // 2 "
                             f"(the exact buckets), got t5_num_buckets={self.t5_num_buckets}, "
                             f"t5_max_distance={self.t5_max_distance}")
        if self.rope_scaling is not None:
            object.__setattr__(self, "rope_scaling", _rope_scaling(self.rope_scaling))
            if self.position != "rope":
                raise ValueError(f"rope_scaling needs position='rope', got position={self.position!r}")
            if self.rope_scaling.rope_type == "dynamic" and self.resolved_head_dim < 4:
                raise ValueError(f"rope_scaling 'dynamic' needs head_dim >= 4 (its exponent is "
                                 f"head_dim / (head_dim - 2)), got {self.resolved_head_dim}")

    # ----------------------------------------------------------------------------- derived sizes

    @property
    def resolved_head_dim(self) -> int:
        """``head_dim``, or ``d_model // n_heads`` when it is not set."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def resolved_n_kv_heads(self) -> int:
        """``n_kv_heads``, or ``n_heads`` (plain multi-head attention) when it is not set."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def resolved_d_ff(self) -> int:
        """``d_ff``, or the default hidden width of the chosen FFN."""
        if self.d_ff is not None:
            return self.d_ff
        if self.ffn in ("swiglu", "geglu"):
            return 8 * math.ceil(8 * self.d_model / 3 / 8)
        return 4 * self.d_model

    @property
    def resolved_ffn_dropout(self) -> float:
        """``ffn_dropout``, or ``dropout`` when it is not set."""
        return self.dropout if self.ffn_dropout is None else self.ffn_dropout

    @property
    def resolved_final_norm(self) -> bool:
        """Whether the stacks end with a norm: by default only pre-norm stacks do."""
        return self.norm_position == "pre" if self.final_norm is None else self.final_norm

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ----------------------------------------------------------------------------- presets

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A published or book-sized configuration, with any field overridden.

        Published sizes: ``"gpt2-small"`` (Radford et al., 2019: 124,439,808 parameters with the
        tied head), ``"transformer-base"`` (Vaswani et al., 2017, Table 3: ~65M with a shared
        37,000-token vocabulary). The book's CPU sizes: ``"tiny"`` (a 2-layer, 64-wide GPT-2-style
        model), ``"small"`` (4 layers, 128 wide), ``"llama-tiny"`` (``"tiny"`` with RoPE, RMSNorm,
        SwiGLU, grouped-query attention and no biases), ``"transformer-tiny"`` (the base
        encoder-decoder at 2 + 2 layers, 64 wide; set ``vocab_size`` and ``tgt_vocab_size``).
        ``"bert-base"`` (Devlin et al., 2019: 109,482,240 parameters without the pre-training
        heads) and ``"bert-tiny"``; ``"t5-small"`` (Raffel et al., 2020: 60,506,624) and
        ``"t5-tiny"``.
        """
        if name not in PRESETS:
            raise ValueError(f"name must be one of {tuple(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name], **overrides})


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _rope_scaling(value: object) -> RopeScaling:
    # a RopeScaling, or the dict {"rope_type": ..., "factor": ...} Hugging Face writes
    if isinstance(value, RopeScaling):
        return value
    if not isinstance(value, dict) or set(value) != {"rope_type", "factor"}:
        raise ValueError(f"rope_scaling must be None, a RopeScaling or a dict with the keys 'rope_type' and "
                         f"'factor', got {value!r}")
    return RopeScaling(value["rope_type"], value["factor"])


def _positive_float(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


_GPT2 = dict(position="learned", norm="layernorm", norm_position="pre", ffn="gelu_tanh", bias=True,
             tie_embeddings=True, norm_eps=1e-5)
_LLAMA = dict(position="rope", norm="rmsnorm", norm_eps=1e-6, norm_position="pre", ffn="swiglu", bias=False,
              tie_embeddings=False, residual_init_scale=False)

PRESETS: dict[str, dict[str, Any]] = {
    "gpt2-small": dict(vocab_size=50257, d_model=768, n_layers=12, n_heads=12, max_len=1024, dropout=0.1,
                       ffn_dropout=0.0, **_GPT2),
    "transformer-base": dict(vocab_size=37000, d_model=512, n_layers=6, n_decoder_layers=6, n_heads=8, d_ff=2048,
                             max_len=1024, position="sinusoidal", norm="layernorm", norm_position="post", ffn="relu",
                             dropout=0.1, ffn_dropout=0.0, scale_embeddings=True, init_std=None),
    "transformer-tiny": dict(vocab_size=256, d_model=64, n_layers=2, n_decoder_layers=2, n_heads=4, d_ff=256,
                             max_len=256, position="sinusoidal", norm="layernorm", norm_position="post", ffn="relu",
                             scale_embeddings=True, init_std=None),
    "bert-base": dict(vocab_size=30522, d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_len=512,
                      position="learned", norm="layernorm", norm_eps=1e-12, norm_position="post", ffn="gelu",
                      bias=True, tie_embeddings=True, dropout=0.1, embedding_norm=True, type_vocab_size=2,
                      residual_init_scale=False, ffn_dropout=0.0),
    "bert-tiny": dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_len=128, position="learned",
                      norm="layernorm", norm_eps=1e-12, norm_position="post", ffn="gelu", bias=True,
                      tie_embeddings=True, embedding_norm=True, type_vocab_size=2, residual_init_scale=False,
                      ffn_dropout=0.0),
    "t5-small": dict(vocab_size=32128, d_model=512, n_layers=6, n_decoder_layers=6, n_heads=8, head_dim=64,
                     d_ff=2048, max_len=512, position="t5", norm="rmsnorm", norm_eps=1e-6, norm_position="pre",
                     ffn="relu", bias=False, tie_embeddings=True, attention_scale=1.0, dropout=0.1, init_std=None),
    "t5-tiny": dict(vocab_size=256, d_model=64, n_layers=2, n_decoder_layers=2, n_heads=4, d_ff=256, max_len=256,
                    position="t5", norm="rmsnorm", norm_eps=1e-6, norm_position="pre", ffn="relu", bias=False,
                    tie_embeddings=True, attention_scale=1.0, init_std=None),
    "tiny": dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, max_len=256, **_GPT2),
    "small": dict(vocab_size=256, d_model=128, n_layers=4, n_heads=4, max_len=512, **_GPT2),
    "llama-tiny": dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_len=256, **_LLAMA),
}
