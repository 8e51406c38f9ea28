"""Helpers shared by the benchmarks: interleaved timing and Markdown tables."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from companion.profiling import synchronize  # noqa: E402

# A benchmark's exit status when its table shows a missed target: a result, which run_all records,
# unlike a crash (status 1), after which it keeps the committed table.
TARGET_MISSED = 3


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call of ``fn``, with the device synchronised before and after."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def rounds(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int,
           warmup: int = 2) -> dict[str, list[float]]:
    """Seconds of each call of each function over ``repeats`` rounds, measured interleaved (one call
    of every function per round) so that load on a shared machine hits all of them alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn, device))
    return times


def compare(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int,
            warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each function over interleaved :func:`rounds`."""
    return {name: statistics.median(t) for name, t in rounds(fns, device, repeats, warmup).items()}


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """Print a Markdown table under a title."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |")
