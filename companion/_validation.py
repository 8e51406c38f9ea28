"""Argument checks shared by companion's modules.

Every public function reports bad input the same way: a ``ValueError`` (wrong value) or a
``TypeError`` (wrong type) whose message names the argument, says what was expected and shows
what was given.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["check_int", "check_choice", "check_dropout", "check_positive_float", "check_features", "tracing"]


def tracing() -> bool:
    """True while ``torch.compile`` traces the code.

    A check that reads a tensor's *values* (``int(ids.max())``) copies them to the host: a sync
    with the device, and under ``torch.compile`` a graph break. Such checks run at the public entry
    points in eager mode and are skipped while tracing (shape and type checks cost nothing and
    always run), so a compiled forward pass is one graph.
    """
    return torch.compiler.is_compiling()


def check_int(name: str, value: object, minimum: int = 1) -> int:
    """``value`` if it is an int (not a bool) ``>= minimum``, else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else a ``ValueError`` listing them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value  # type: ignore[return-value]


def check_dropout(dropout: object) -> float:
    """A dropout probability in ``[0, 1)`` as a float."""
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
    return float(dropout)


def check_positive_float(name: str, value: object) -> float:
    """A positive, finite number as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def check_features(x: object, d_model: int, ndim: int | None = None) -> Tensor:
    """A floating-point tensor ``(..., d_model)`` (exactly ``ndim`` dims if given), named ``x``."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        got = x.dtype if isinstance(x, Tensor) else type(x).__name__
        raise TypeError(f"x must be a floating-point torch.Tensor, got {got}")
    if ndim is None and (x.dim() < 1 or x.shape[-1] != d_model):
        raise ValueError(f"x must have shape (..., d_model={d_model}), got {tuple(x.shape)}")
    if ndim == 3 and (x.dim() != 3 or x.shape[-1] != d_model):
        raise ValueError(f"x must have shape (batch, seq, d_model={d_model}), got {tuple(x.shape)}")
    return x
