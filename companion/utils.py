"""Small utilities every chapter uses: seeding, device selection, parameter counting."""

from __future__ import annotations

import os
import random
import warnings
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

__all__ = ["seed_everything", "get_device", "count_parameters", "progress", "progress_write"]

_DEVICE_ORDER = ("cuda", "mps", "cpu")


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python's ``random``, NumPy and PyTorch (CPU and every CUDA device).

    Args:
        seed: a non-negative integer.

    Returns:
        A fresh CPU ``torch.Generator`` seeded with ``seed``, for code that prefers an explicit
        generator to the global one.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    os.environ["PYTHONHASHSEED"] = str(seed)  # for subprocesses; this one is already running
    return torch.Generator().manual_seed(seed)


def _is_available(kind: str) -> bool:
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()
    return kind == "cpu"


def get_device(prefer: str | torch.device | None = None) -> torch.device:
    """The device to run on.

    With ``prefer=None``, the best available one: CUDA, then Apple's MPS, then the CPU. With an
    explicit choice (``"cuda"``, ``"cuda:1"``, ``"mps"``, ``"cpu"`` or a ``torch.device``) that
    device, or a ``RuntimeError`` saying why it cannot be used.
    """
    if prefer is None:
        return torch.device(next(k for k in _DEVICE_ORDER if _is_available(k)))
    try:
        device = torch.device(prefer)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"prefer must be None, 'cuda', 'cuda:N', 'mps', 'cpu' or a torch.device, got {prefer!r}"
        ) from err
    if device.type not in _DEVICE_ORDER:
        raise ValueError(f"prefer must name one of {_DEVICE_ORDER}, got {prefer!r}")
    if not _is_available(device.type):
        raise RuntimeError(
            f"device {str(device)!r} was requested but is not available on this machine "
            f"(available: {[k for k in _DEVICE_ORDER if _is_available(k)]})"
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise RuntimeError(
            f"device {str(device)!r} was requested but only {torch.cuda.device_count()} CUDA device(s) exist"
        )
    return device


def count_parameters(module: nn.Module, trainable_only: bool = True) -> int:
    """Number of scalar parameters in ``module`` (only those with ``requires_grad`` by default).

    Parameters shared between submodules (tied embeddings) are counted once.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def progress(iterable: Iterable | None = None, *, enabled: bool = True, **kwargs):
    """A ``tqdm`` progress bar: a widget in Jupyter when ``ipywidgets`` is installed, text otherwise.

    ``enabled=False`` hides it. The environment variable ``TQDM_DISABLE=1`` hides every bar that
    is not forced on; the book's test runs set it, so that stored notebook outputs hold no
    progress frames while a reader running a cell still sees the bar. Other keyword arguments go
    to ``tqdm`` (``desc``, ``total``, ``leave``, ...).
    """
    with warnings.catch_warnings():
        # tqdm.auto warns once, at import, when Jupyter lacks ipywidgets; it then falls back to
        # text bars, which is what we want. Silence that here only, not process-wide.
        warnings.simplefilter("ignore")
        from tqdm.auto import tqdm
    if not enabled:
        kwargs["disable"] = True
    return tqdm(iterable, **kwargs)


def progress_write(line: str) -> None:
    """Print ``line`` above any open :func:`progress` bar (``tqdm.write``), so that the bar is not torn."""
    from tqdm.auto import tqdm

    tqdm.write(line)
