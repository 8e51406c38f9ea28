"""The position-wise feed-forward network (FFN) and its gated variant SwiGLU.

After attention has mixed information *across* positions, every token goes through the same
small two-layer network on its own (Vaswani et al., 2017, eq. 2)::

    FFN(x) = act(x W_1 + b_1) W_2 + b_2        x: (batch, seq, d_model), hidden (batch, seq, d_ff)

"Position-wise" means the weights are shared by all positions and no position sees another:
it is a 1×1 convolution over the sequence. The gated variant used by LLaMA, PaLM and Mistral
(Shazeer, 2020) multiplies two projections, one passed through Swish (SiLU)::

    SwiGLU(x) = (Swish(x W_gate) ⊙ x W_in) W_out

It has three weight matrices instead of two, so at equal parameter count its hidden width is
2/3 of the ReLU FFN's: ``8/3 · d_model`` instead of ``4 · d_model``
(:func:`swiglu_hidden_size`, :func:`matching_swiglu_hidden_size`).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import check_dropout, check_features, check_int
from companion.config import ModelConfig

__all__ = ["ACTIVATIONS", "activation", "FeedForward", "GatedFeedForward", "SwiGLU", "make_ffn", "swiglu_hidden_size",
           "matching_swiglu_hidden_size"]

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")


def activation(name: str, h: Tensor) -> Tensor:
    """Apply the non-linearity ``name`` (one of :data:`ACTIVATIONS`) element-wise.

    ``"gelu"`` is the exact ``z·Φ(z)`` (BERT); ``"gelu_tanh"`` its tanh approximation (GPT-2's
    ``gelu_new``, T5 v1.1); ``"silu"`` is Swish with β = 1.
    """
    if name == "relu":
        return F.relu(h)
    if name == "gelu":
        return F.gelu(h)
    if name == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    if name == "silu":
        return F.silu(h)
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")


def swiglu_hidden_size(d_model: int, multiple_of: int = 8) -> int:
    """SwiGLU's default hidden width: ``8/3 · d_model`` rounded **up** to a multiple of ``multiple_of``.

    LLaMA uses ``int(2/3 · 4 · d_model)`` rounded up to a multiple of 256 (``multiple_of``) so the
    matrices tile well on accelerators; here the default is 8, sensible for tiny models.
    ``swiglu_hidden_size(512) == 1368`` (1365.3 rounded up).
    """
    check_int("d_model", d_model)
    check_int("multiple_of", multiple_of)
    hidden = int(8 * d_model / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def matching_swiglu_hidden_size(d_model: int, d_ff: int, bias: bool = False) -> int:
    """Hidden width of a :class:`SwiGLU` with about the parameters of a ``FeedForward(d_model, d_ff)``.

    A ReLU FFN has ``2 · d_model · d_ff`` weights (+ ``d_ff + d_model`` biases); a SwiGLU of
    width ``h`` has ``3 · d_model · h`` (+ ``2h + d_model`` biases). Solving for ``h`` and
    rounding to the nearest integer gives ``h ≈ 2/3 · d_ff``. The FFN is taken with biases (as in
    the paper); ``bias`` says whether the SwiGLU has them.
    """
    check_int("d_model", d_model)
    check_int("d_ff", d_ff)
    target = 2 * d_model * d_ff + d_ff + d_model
    if bias:
        return max(1, round((target - d_model) / (3 * d_model + 2)))
    return max(1, round(target / (3 * d_model)))


class FeedForward(nn.Module):
    """The position-wise FFN ``act(x W_1 + b_1) W_2 + b_2`` (Vaswani et al., 2017, eq. 2).

    Args:
        d_model: input and output width.
        d_ff: hidden width (2048 = 4 · 512 in the paper).
        activation: ``"relu"`` (the paper), ``"gelu"`` (BERT; the exact erf form),
            ``"gelu_tanh"`` (GPT-2's tanh approximation) or ``"silu"`` (Swish with β = 1).
        dropout: dropout on the hidden activations (training mode only).
        bias: whether both Linear layers have biases.

    ``forward(x)``: ``(..., d_model)`` -> ``(..., d_model)``; every position independently.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        check_int("d_model", d_model)
        check_int("d_ff", d_ff)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)  # the "keys": pattern detectors
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)  # the "values": what each detector writes back
        self.dropout = nn.Dropout(check_dropout(dropout))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"

    def act(self, h: Tensor) -> Tensor:
        """The non-linearity, applied element-wise to the hidden pre-activations ``(..., d_ff)``."""
        return activation(self.activation, h)

    def hidden(self, x: Tensor) -> Tensor:
        """The hidden activations ``act(x W_1 + b_1)``, ``(..., d_ff)`` (the memory "key" matches)."""
        return self.act(self.w1(check_features(x, self.d_model)))

    def forward(self, x: Tensor) -> Tensor:
        """``(..., d_model)`` -> ``(..., d_model)``."""
        return self.w2(self.dropout(self.hidden(x)))


class GatedFeedForward(nn.Module):
    """A gated FFN ``(act(x W_gate) ⊙ x W_in) W_out`` (Shazeer, 2020): SwiGLU with Swish, GEGLU with GELU.

    Args:
        d_model: input and output width.
        d_ff: hidden width; default :func:`swiglu_hidden_size` (``8/3 · d_model`` rounded up to a
            multiple of ``multiple_of``), which matches the parameters of a ``4 · d_model`` FFN.
        activation: the gate's non-linearity, one of :data:`ACTIVATIONS` (``"silu"``: SwiGLU,
            LLaMA's MLP; ``"gelu_tanh"``: GEGLU, T5 v1.1).
        multiple_of: rounding of the default width.
        dropout: dropout on the gated hidden activations.
        bias: biases on the three projections (LLaMA, T5: none).
    """

    def __init__(self, d_model: int, d_ff: int | None = None, *, activation: str = "silu", multiple_of: int = 8,
                 dropout: float = 0.0, bias: bool = False) -> None:
        super().__init__()
        check_int("d_model", d_model)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        d_ff = swiglu_hidden_size(d_model, multiple_of) if d_ff is None else check_int("d_ff", d_ff)
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        self.w_gate = nn.Linear(d_model, d_ff, bias=bias)
        self.w_in = nn.Linear(d_model, d_ff, bias=bias)
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(check_dropout(dropout))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"

    def hidden(self, x: Tensor) -> Tensor:
        """The gated hidden activations ``act(x W_gate) ⊙ x W_in``, ``(..., d_ff)``."""
        check_features(x, self.d_model)
        return activation(self.activation, self.w_gate(x)) * self.w_in(x)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., d_model)`` -> ``(..., d_model)``."""
        return self.w_out(self.dropout(self.hidden(x)))


class SwiGLU(GatedFeedForward):
    """Swish-gated FFN ``(Swish(x W_gate) ⊙ x W_in) W_out`` (Shazeer, 2020, eq. 6; LLaMA's MLP).

    A :class:`GatedFeedForward` with ``activation="silu"``; same arguments otherwise.
    """

    def __init__(self, d_model: int, d_ff: int | None = None, *, multiple_of: int = 8, dropout: float = 0.0,
                 bias: bool = False) -> None:
        super().__init__(d_model, d_ff, activation="silu", multiple_of=multiple_of, dropout=dropout, bias=bias)


def make_ffn(config: ModelConfig) -> nn.Module:
    """The feed-forward network a :class:`~companion.config.ModelConfig` asks for.

    ``config.ffn`` names it: a plain :class:`FeedForward` with that activation, or a gated one
    (``"swiglu"``, ``"geglu"``), of hidden width ``config.resolved_d_ff``, with dropout
    ``config.resolved_ffn_dropout`` on its hidden units.
    """
    d_ff, dropout = config.resolved_d_ff, config.resolved_ffn_dropout
    if config.ffn == "swiglu":
        return SwiGLU(config.d_model, d_ff, dropout=dropout, bias=config.bias)
    if config.ffn == "geglu":
        return GatedFeedForward(config.d_model, d_ff, activation="gelu_tanh", dropout=dropout, bias=config.bias)
    return FeedForward(config.d_model, d_ff, config.ffn, dropout=dropout, bias=config.bias)
