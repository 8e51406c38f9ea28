"""Measuring code, the same way in every chapter and benchmark: time, CPU usage and saved activations.

Timings on a shared machine are noisy; :func:`best_time` reports the *minimum* over a few runs,
the least disturbed one, and synchronises the device so that asynchronous GPU work is counted.
On a busy CPU, ``clock="cpu"`` measures the CPU time the process used instead of the wall
time, which other programs do not inflate (on the CPU only: GPU work is not CPU time).
:func:`cpu_usage_of` splits that CPU time into *user* time (the program's own code) and *system*
time (the operating system working for it, mostly handing out fresh memory: the first touch of
each new page is a *page fault*, which it also counts).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from companion._validation import check_int

__all__ = ["synchronize", "best_time", "CpuUsage", "cpu_usage", "cpu_usage_of", "saved_tensor_bytes"]


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for the queued work of ``device`` (CUDA or MPS) to finish; a no-op on the CPU."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def best_time(fn: Callable[[], object], repeats: int = 5, *, warmup: int = 1, inner: int = 1,
              device: torch.device | str | None = None, clock: str = "wall") -> float:
    """Seconds per call of ``fn()``: the minimum over ``repeats`` runs of the mean of ``inner`` calls.

    ``warmup`` calls run first and are not timed (the first call pays for allocation and kernel
    selection). ``device`` is synchronised around each run, so GPU work is timed to completion.
    ``clock``: ``"wall"`` (elapsed time) or ``"cpu"`` (CPU time of this process, all threads;
    robust to other programs on a shared machine, meaningful for CPU work only).
    """
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    check_int("inner", inner, 1)
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    now = time.perf_counter if clock == "wall" else time.process_time
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = now()
        for _ in range(inner):
            fn()
        synchronize(device)
        best = min(best, (now() - start) / inner)
    return best


class CpuUsage(NamedTuple):
    """CPU time of this process, all threads: ``user`` and ``system`` seconds, and minor ``page_faults``."""

    user: float
    system: float
    page_faults: int

    @property
    def seconds(self) -> float:
        """``user + system``."""
        return self.user + self.system

    def __sub__(self, other: CpuUsage) -> CpuUsage:  # type: ignore[override]
        return CpuUsage(self.user - other.user, self.system - other.system, self.page_faults - other.page_faults)


def cpu_usage() -> CpuUsage:
    """The CPU time and page faults this process has used so far (page faults are 0 on Windows)."""
    try:
        import resource  # Unix only
    except ImportError:  # Windows: user and system time from os.times(), no page-fault count
        times = os.times()
        return CpuUsage(times.user, times.system, 0)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return CpuUsage(usage.ru_utime, usage.ru_stime, usage.ru_minflt)


def cpu_usage_of(fn: Callable[[], object]) -> CpuUsage:
    """The :class:`CpuUsage` of one call of ``fn()`` (CPU work only: queued GPU work is not counted).

    The operating system splits CPU time between user and system at its clock ticks, a few
    milliseconds apart: read the split only for calls much longer than that.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    before = cpu_usage()
    fn()
    return cpu_usage() - before


def saved_tensor_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the distinct tensor storages autograd saves for the backward pass while ``fn()`` runs.

    This is the activation memory a training step must hold: for explicit attention it includes
    the ``(batch, heads, q_len, k_len)`` weight matrix, which fused kernels never store.
    """
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        except RuntimeError:  # tensor subclasses without a storage
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())
