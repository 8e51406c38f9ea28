"""Layer normalisation and RMS normalisation, written from their equations.

Both normalise each token's feature vector on its own — over the last dim, ``d_model`` — so they
do not depend on the batch (unlike BatchNorm, which normalises each feature across the batch).

* :class:`LayerNorm` (Ba et al., 2016)::

      μ = mean(x),  σ² = mean((x − μ)²),  LayerNorm(x) = (x − μ) / √(σ² + ε) · γ + β

  invariant to adding a constant to every feature (shift) and to multiplying by one (scale).
* :class:`RMSNorm` (Zhang & Sennrich, 2019)::

      RMS(x) = √(mean(x²) + ε),  RMSNorm(x) = x / RMS(x) · γ

  no mean, no β: cheaper, still scale invariant, but not shift invariant.

Both equal ``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm`` given the same parameters and ε
(tested), and call PyTorch's own functions, ``F.layer_norm`` and ``F.rms_norm``. On the CPU
``F.layer_norm`` is one fused kernel, one pass over the data; ``F.rms_norm`` is not: its CPU path
runs the equation's operations one by one (a power, a mean, a product; about 2.7 times
``F.layer_norm``'s time on a (64, 256, 512) input, one thread, torch 2.13), so RMSNorm's saving in
arithmetic shows only where its kernel is fused. Chapter 8 builds both from the equations and
times them against these.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import check_features

__all__ = ["LayerNorm", "RMSNorm", "NORMS", "make_norm"]

NORMS = ("layernorm", "rmsnorm")


def _check_args(d_model: object, eps: object) -> None:
    if isinstance(d_model, bool) or not isinstance(d_model, int) or d_model < 1:
        raise ValueError(f"d_model must be an int >= 1, got {d_model!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"eps must be a positive float, got {eps!r}")




class LayerNorm(nn.Module):
    """``(x − μ) / √(σ² + ε) · γ + β`` over the last dim (Ba et al., 2016, eq. 4; Vaswani et al., 2017).

    Args:
        d_model: size of the normalised (last) dim.
        eps: added to the variance (``torch.nn.LayerNorm`` default 1e-5).
        bias: learn ``β`` (True) or leave it out (as some recent models do).

    ``forward(x)``: ``(..., d_model)`` -> same shape. ``σ²`` is the biased (population) variance.
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        _check_args(d_model, eps)
        self.d_model, self.eps = d_model, float(eps)
        self.weight = nn.Parameter(torch.ones(d_model))  # γ
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None  # β

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, eps={self.eps:g}, bias={self.bias is not None}"

    def forward(self, x: Tensor) -> Tensor:
        """Normalise each ``(d_model,)`` vector of ``x`` ``(..., d_model)``."""
        check_features(x, self.d_model)
        if x.dtype != self.weight.dtype:  # e.g. half activations, float32 weights: normalise in float32
            bias = None if self.bias is None else self.bias.float()
            return F.layer_norm(x.float(), (self.d_model,), self.weight.float(), bias, self.eps).to(x.dtype)
        return F.layer_norm(x, (self.d_model,), self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """``x / √(mean(x²) + ε) · γ`` over the last dim (Zhang & Sennrich, 2019, eq. 4; LLaMA).

    Args:
        d_model: size of the normalised (last) dim.
        eps: added to the mean square (LLaMA uses 1e-6; ``torch.nn.RMSNorm`` defaults to the
            dtype's machine epsilon, so pass ``eps`` explicitly when comparing).

    ``forward(x)``: ``(..., d_model)`` -> same shape.
    """

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        _check_args(d_model, eps)
        self.d_model, self.eps = d_model, float(eps)
        self.weight = nn.Parameter(torch.ones(d_model))  # γ

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, eps={self.eps:g}"

    def forward(self, x: Tensor) -> Tensor:
        """Rescale each ``(d_model,)`` vector of ``x`` ``(..., d_model)`` to unit RMS, then by γ."""
        check_features(x, self.d_model)
        if x.dtype != self.weight.dtype:  # e.g. half activations, float32 weights: normalise in float32
            return F.rms_norm(x.float(), (self.d_model,), self.weight.float(), self.eps).to(x.dtype)
        return F.rms_norm(x, (self.d_model,), self.weight, self.eps)


def make_norm(kind: str, d_model: int, eps: float | None = None, bias: bool = True) -> nn.Module:
    """A :class:`LayerNorm` (``kind="layernorm"``, with ``β`` if ``bias``) or :class:`RMSNorm` (``"rmsnorm"``)."""
    if kind not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")
    if kind == "layernorm":
        return LayerNorm(d_model, bias=bias) if eps is None else LayerNorm(d_model, eps, bias=bias)
    return RMSNorm(d_model) if eps is None else RMSNorm(d_model, eps)
