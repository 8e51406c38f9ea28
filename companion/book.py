"""What every chapter's notebook shares: the ``SCALE`` knob, the device it picks, and the
headline numbers a chapter exports for Appendix C ("The book at scale").

A chapter starts with ::

    SCALE = book_scale(1)        # raise it on a GPU: 2, 4, ...
    device = book_device(SCALE)  # the CPU at SCALE 1, the best device above

and ends with ``export_headlines({...})``. A reader edits the one number; a script sets the
environment instead (``scripts/scale.py``, ``make scale``):

* ``BOOK_SCALE``: the scale, a positive integer; when set it wins over the number in the cell.
* ``BOOK_DEVICE``: ``cpu``, ``cuda``, ``cuda:1`` or ``mps``; when set it wins over the default.
* ``BOOK_RESULTS``: a file; when set, ``export_headlines`` appends one JSON line to it.

At ``SCALE = 1`` on the CPU a chapter prints exactly what its committed outputs store (CI checks
that); every chapter also runs to the end at larger scales on any device, where what it prints
is allowed to change.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from companion.utils import get_device

__all__ = ["book_scale", "book_device", "export_headlines", "SCALE_ENV", "DEVICE_ENV", "RESULTS_ENV"]

SCALE_ENV = "BOOK_SCALE"
DEVICE_ENV = "BOOK_DEVICE"
RESULTS_ENV = "BOOK_RESULTS"


def book_scale(default: int = 1) -> int:
    """The chapter's ``SCALE``: ``$BOOK_SCALE`` when it is set, else ``default``.

    Raises:
        ValueError: ``default`` or ``$BOOK_SCALE`` is not a positive integer.
    """
    if isinstance(default, bool) or not isinstance(default, int) or default < 1:
        raise ValueError(f"default must be a positive int, got {default!r}")
    text = os.environ.get(SCALE_ENV, "").strip()
    if not text:
        return default
    try:
        scale = int(text)
    except ValueError:
        scale = 0
    if scale < 1:
        raise ValueError(f"${SCALE_ENV} must be a positive integer, got {text!r}")
    return scale


def book_device(scale: int) -> torch.device:
    """The device a chapter runs on: ``$BOOK_DEVICE`` when it is set, else the CPU at
    ``scale == 1`` (the run whose outputs the book stores) and the best available device above
    (CUDA, then MPS, then the CPU; see :func:`companion.utils.get_device`).

    On the CPU it also flushes subnormal floats to zero in this thread
    (:func:`torch.set_flush_denormal`): the speed of a training run then no longer depends on how
    a CPU handles them, and nothing a chapter prints changes.

    Raises:
        ValueError: ``scale`` is not a positive int, or ``$BOOK_DEVICE`` names no device kind.
        RuntimeError: ``$BOOK_DEVICE`` names a device this machine does not have.
    """
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ValueError(f"scale must be a positive int, got {scale!r}")
    chosen = os.environ.get(DEVICE_ENV, "").strip()
    if chosen:
        device = get_device(chosen)
    else:
        device = get_device("cpu") if scale == 1 else get_device()
    if device.type == "cpu":
        # Training makes subnormal floats (below 1.2e-38: far softmax tails, vanishing gradients,
        # Adam's moments of them). Many CPUs take a slow microcode path for every operation on one
        # (seen here: a Chapter 4 run 5x slower, more with generic kernels); at that size they
        # cannot move a weight, so flush them to zero, as Chapter 1 explains.
        torch.set_flush_denormal(True)
    return device


def _plain(value, key: str):
    """``value`` as a JSON number, string, bool or list of them (tensors and NumPy scalars too)."""
    if hasattr(value, "tolist"):  # torch.Tensor, numpy arrays and scalars
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v, key) for v in value]
    if isinstance(value, bool) or isinstance(value, (int, str)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    raise ValueError(f"headline {key!r} must be a number, string, bool or a list of them, got {type(value).__name__}")


def export_headlines(
    numbers: Mapping[str, object], *, device: torch.device | str | None = None, chapter: str | None = None
) -> None:
    """Record a chapter's headline numbers, the ones its ledger rows cite.

    With ``$BOOK_RESULTS`` set, one JSON line ``{"chapter", "scale", "device", "numbers"}`` is
    appended to that file (``scripts/scale.py`` collects them into ``book/results/scale/``);
    otherwise nothing is written. Prints and returns nothing, so a notebook cell that ends with
    the call shows no output (values that are not plain numbers still raise ``ValueError``).

    Args:
        numbers: name -> value (a float, int, string, bool, or a list of them; tensors and
            NumPy values are converted). Names say the unit, e.g. ``"gpt_loss_nats_per_char"``.
        device: the device the chapter ran on (recorded with the numbers).
        chapter: the notebook's name; default ``$BOOK_CHAPTER`` (set by the scale script) or
            ``"unknown"``.
    """
    if not isinstance(numbers, Mapping) or not numbers:
        raise ValueError(f"numbers must be a non-empty mapping of name -> value, got {numbers!r}")
    plain = {str(k): _plain(v, str(k)) for k, v in numbers.items()}
    target = os.environ.get(RESULTS_ENV, "").strip()
    if target:
        record = {
            "chapter": chapter or os.environ.get("BOOK_CHAPTER", "unknown"),
            "scale": book_scale(1),
            "device": str(device) if device is not None else (os.environ.get(DEVICE_ENV, "") or None),
            "numbers": plain,
        }
        with Path(target).open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
