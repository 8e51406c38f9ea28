"""Helpers shared by the benchmarks: interleaved timing, the status of a ratio against its target, Markdown tables."""

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

# How far past its target a ratio must be for "ok": separate runs of one benchmark on one machine
# move a ratio by about this much. Ten runs of benchmarks/gpt.py on one 2-core machine put the KV
# cache's ratio between 8.5x and 11.8x at width 256 (median 9.6x) and between 5.2x and 6.4x at
# width 128 (median 5.3x), up to about 20% from the median; its training ratio moved between 1.1x
# and 1.5x over runs on two machines. A median that meets its target by less than this is "borderline".
BORDERLINE_MARGIN = 0.2
# The statuses that meet a target; anything else in a status column is a miss ("BELOW", "OVER")
# or a wrong result ("NO"). "-" (no target) and "(...)" (an information row) are neither.
MET = ("ok", "borderline")


def status(value: float, target: float, *, higher_is_better: bool = True, worst: float | None = None) -> str:
    """The status of a measured ratio against its target: "ok", "borderline", or a miss.

    A miss is "BELOW" for a target the value must reach (``higher_is_better``, e.g. a speed-up of
    ``>= 5x``) and "OVER" for one it must stay under (e.g. a time ratio of ``<= 1.10x``). A value
    that meets its target by less than :data:`BORDERLINE_MARGIN` (20%) is "borderline", not "ok":
    separate runs move a ratio by about that much, so the next run could miss. The margin is a
    factor, applied the same way in both directions (``value < target * 1.2`` and
    ``value > target / 1.2`` are borderline), so a time ratio and the speed ratio that is its
    inverse get the same status. ``worst`` is the least favourable of the rounds behind a median:
    a round that misses the target makes a met median "borderline" too. Borderline is not a miss.
    """
    factor = 1 + BORDERLINE_MARGIN
    if higher_is_better:
        if value < target:
            return "BELOW"
        close = value < target * factor or (worst is not None and worst < target)
    else:
        if value > target:
            return "OVER"
        close = value > target / factor or (worst is not None and worst > target)
    return "borderline" if close else "ok"


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
