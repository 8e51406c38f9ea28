"""Learning-rate schedules: warm-up, then a decay (Vaswani et al., 2017, eq. 3; Loshchilov & Hutter, 2017).

Two kinds of function, named for what they return:

* :func:`noam` is the Transformer paper's rate itself, a function of the step number counted
  from 1: ``lr(step) = factor · d_model^−0.5 · min(step^−0.5, step · warmup^−1.5)`` — linear
  warm-up for ``warmup`` steps, then decay as the inverse square root of the step.
* :func:`warmup_cosine_schedule` and :func:`warmup_linear_schedule` return a **multiplier** of a
  base rate, a function of the 0-based step index that :func:`companion.training.train` passes:
  linear warm-up to 1, then a cosine (or linear) decay to ``min_ratio`` at ``total_steps``.

To train with :func:`noam`, make it the multiplier of a base rate of 1:
``train(..., lr=1.0, lr_schedule=lambda i: rate(i + 1))`` with ``rate = noam(d_model, warmup)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from companion._validation import check_int, check_positive_float

__all__ = ["noam", "warmup_cosine_schedule", "warmup_linear_schedule"]


def noam(d_model: int, warmup: int, factor: float = 1.0) -> Callable[[int], float]:
    """The Transformer's learning rate (Vaswani et al., 2017, eq. 3), for steps counted from 1.

    ``lr(step) = factor · d_model^−0.5 · min(step^−0.5, step · warmup^−1.5)``: it rises linearly
    to its peak ``factor · (d_model · warmup)^−0.5`` at ``step = warmup``, then decays as
    ``1/√step``. The paper used ``warmup = 4000`` with ``d_model = 512`` (peak ≈ 7e-4).
    """
    check_int("d_model", d_model)
    check_int("warmup", warmup)
    check_positive_float("factor", factor)

    def rate(step: int) -> float:
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step must be an int >= 1 (noam counts steps from 1), got {step!r}")
        return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)

    return rate


def _check_warmup(warmup_steps: object, total_steps: object, min_ratio: object) -> None:
    check_int("warmup_steps", warmup_steps, 0)
    check_int("total_steps", total_steps, 1)
    if warmup_steps > total_steps:
        raise ValueError(f"warmup_steps must be <= total_steps, got {warmup_steps} > {total_steps}")
    if isinstance(min_ratio, bool) or not isinstance(min_ratio, (int, float)) or not 0 <= min_ratio <= 1:
        raise ValueError(f"min_ratio must be a number in [0, 1], got {min_ratio!r}")


def warmup_cosine_schedule(warmup_steps: int, total_steps: int, min_ratio: float = 0.1) -> Callable[[int], float]:
    """Learning-rate multiplier for 0-based steps: linear warm-up to 1, then cosine decay to ``min_ratio``."""
    _check_warmup(warmup_steps, total_steps, min_ratio)

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return multiplier


def warmup_linear_schedule(warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> Callable[[int], float]:
    """Learning-rate multiplier for 0-based steps: linear warm-up to 1, then linear decay to ``min_ratio``."""
    _check_warmup(warmup_steps, total_steps, min_ratio)

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 1 - (1 - min_ratio) * min(1.0, progress)

    return multiplier
