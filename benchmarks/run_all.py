#!/usr/bin/env python3
"""Run every benchmark and store its tables in ``benchmarks/results/`` (``make bench``).

    python benchmarks/run_all.py                 # the full runs (several minutes on 2 cores)
    python benchmarks/run_all.py --quick         # smaller shapes, a smoke test (tables to a temporary folder)
    python benchmarks/run_all.py --only gpt      # one benchmark
    python benchmarks/run_all.py --only gpt --device cuda   # on a GPU: results/gpt-cuda.md
    python benchmarks/run_all.py --force         # write the tables even if the machine was busy

Each result file is the benchmark's own Markdown output under a header that records the machine
it ran on (CPU model, cores, load average at its start and end), the PyTorch version, the command and the
date. Appendix B (``book/B_performance.ipynb``) renders these files as committed; run this on a
quiet machine, then re-execute the appendix (``make execute NB=book/B_performance.ipynb``).

A busy machine slows the two sides of a ratio unequally, so a run whose 1-minute load average is
above ``LOAD_LIMIT`` (0.5) at its start or its end does not replace a table in
``benchmarks/results/``: it stops before running when the load at the start is too high, keeps a
table whose load at the end was too high in a temporary folder, and exits with ``LOAD_REFUSED``
(4). A benchmark's own threads stay in the 1-minute average for a minute or two after it ends (on
2 cores they alone hold it above 0.5 for about 90 s), so each load is read once the average has
fallen to the limit, waiting up to ``SETTLE_S`` seconds for it (the header records the wait).
``--force`` writes the table anyway, without waiting, and says so in its header. ``--quick`` runs
write to a temporary folder and are never refused.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import TARGET_MISSED

HERE = Path(__file__).resolve().parent
BENCHMARKS = {
    "attention": ["attention.py"],
    "bpe": ["bpe.py"],
    "gpt": ["gpt.py"],
    "inference": ["inference.py"],
}
QUICK = {"attention": ["--quick"], "bpe": ["--vocab-size", "2048", "--naive-vocab", "512", "--repeats", "1"],
         "gpt": ["--quick"], "inference": ["--quick"]}
# The highest 1-minute load average at which a run may replace a committed table without --force:
# other work on the machine takes cores from one side of a ratio more than from the other.
LOAD_LIMIT = 0.5
LOAD_REFUSED = 4  # the exit status when a committed table was not replaced because of the load
SETTLE_S = 180  # the longest wait for the load average to fall to LOAD_LIMIT before it is read
POLL_S = 5  # the kernel updates the load average every 5 s


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> str:
    """Versions of the libraries the benchmarks compare against."""
    from importlib.metadata import PackageNotFoundError, version

    found = [f"torch {torch.__version__}"]
    for package in ("transformers", "tokenizers", "torchao"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def load_average() -> float | None:
    """The 1-minute load average, where the system reports one (``None`` elsewhere, e.g. on Windows)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def settled_load() -> tuple[float | None, float]:
    """The 1-minute load average once it is at most :data:`LOAD_LIMIT`, or after :data:`SETTLE_S`
    seconds of waiting if it stays above; and the seconds waited.

    The average decays with a time constant of a minute, so the threads of a benchmark that has
    just ended (or of the one before it) would otherwise be read as other work on the machine.
    """
    start = time.monotonic()
    load = load_average()
    if load is not None and load > LOAD_LIMIT:
        print(f"  load average {load:.2f}: waiting up to {SETTLE_S} s for it to fall to {LOAD_LIMIT} ...",
              flush=True)
    while load is not None and load > LOAD_LIMIT and time.monotonic() - start < SETTLE_S:
        time.sleep(POLL_S)
        load = load_average()
    return load, time.monotonic() - start


def shown(load: float | None, waited: float = 0.0) -> str:
    text = "n/a" if load is None else f"{load:.2f}"
    return text + (f" (after {waited:.0f} s for the load to settle)" if waited >= 1 else "")


def too_busy(loads: dict[str, float | None]) -> dict[str, float]:
    """Those of ``{"start": load, "end": load}`` above :data:`LOAD_LIMIT` (an unknown load is not)."""
    return {when: load for when, load in loads.items() if load is not None and load > LOAD_LIMIT}


def refusal(path: Path, busy: dict[str, float], kept: Path | None = None) -> str:
    """Why ``path`` was not overwritten: the load, the limit, and the flag that overrides it."""
    loads = " and ".join(f"{load:.2f} at the {when}" for when, load in busy.items())
    kept_at = f"; this run's table is in {kept}" if kept else ""
    return (f"{path} not overwritten: the 1-minute load average was {loads} of the run, above {LOAD_LIMIT} "
            f"(other work on the machine skews the ratios){kept_at}. Run it on a quiet machine, or pass --force "
            "to write it anyway (its header then says so).")


def gpu_model() -> str:
    """The GPU's name, memory and CUDA version, e.g. ``NVIDIA H200 (139 GiB), CUDA 13.0``."""
    props = torch.cuda.get_device_properties(0)
    return f"{props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"


def header(name: str, command: list[str], load_start: float | None, load_end: float | None, quick: bool = False,
           device: str = "cpu", forced: bool = False, waited: tuple[float, float] = (0.0, 0.0)) -> str:
    if quick:
        written = f"{name}.md: a smoke test by `benchmarks/run_all.py --quick` (smaller shapes), not the committed ones"
    elif device == "cpu":
        written = f"benchmarks/results/{name}.md: written by `make bench` (benchmarks/run_all.py)"
    else:
        written = f"benchmarks/results/{name}.md: written by `benchmarks/run_all.py --device {device}`"
    gpu = [f"- **GPU**: {gpu_model()}"] if device == "cuda" else []
    force = f" (above {LOAD_LIMIT}: written with `--force`)" if forced else ""
    return "\n".join([
        f"<!-- {written} -->",
        *gpu,
        f"- **machine**: {cpu_model()}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}"
        f"; PyTorch's CPU kernels: {torch.backends.cpu.get_cpu_capability()}",
        f"- **software**: Python {platform.python_version()}, {versions()}",
        f"- **load average** (1 min) at the start: {shown(load_start, waited[0])}; at the end: "
        f"{shown(load_end, waited[1])}{force}",
        f"- **command**: `python {' '.join(command)}`",
        f"- **date**: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "",
    ])


def as_markdown(output: str) -> str:
    """The benchmark's output with a blank line before each table, so that Markdown renders it."""
    lines: list[str] = []
    for line in output.strip().splitlines():
        if line.startswith("|") and lines and lines[-1] and not lines[-1].startswith("|"):
            lines.append("")
        lines.append(line)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller shapes, for a smoke test")
    parser.add_argument("--only", choices=sorted(BENCHMARKS), action="append", help="run only these (repeatable)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: run attention and gpt on the GPU, into results/NAME-cuda.md")
    parser.add_argument("--force", action="store_true",
                        help=f"replace the committed tables even if the load average was above {LOAD_LIMIT} "
                             "(the header records it)")
    args = parser.parse_args()
    # --quick is a smoke test: its tables go to a temporary folder, never over the committed results
    out = Path(tempfile.mkdtemp(prefix="bench-quick-")) if args.quick else HERE / "results"
    out.mkdir(exist_ok=True)
    missed: list[str] = []
    names = args.only or sorted(BENCHMARKS)
    if args.device == "cuda":
        names = [n for n in names if n != "bpe"]  # tokenizer training runs on the CPU
    for name in names:
        command = [f"benchmarks/{BENCHMARKS[name][0]}", *(QUICK[name] if args.quick else []),
                   *(["--device", "cuda"] if args.device == "cuda" else [])]
        result = f"{name}-cuda" if args.device == "cuda" else name
        print(f"running {' '.join(command)} ...", flush=True)
        path = out / f"{result}.md"
        # for a committed table, each load is read once the benchmarks' own load has decayed
        settle = not args.quick and not args.force
        load_start, waited_start = settled_load() if settle else (load_average(), 0.0)
        busy = {} if args.quick else too_busy({"start": load_start})
        if busy and not args.force:  # no point in running: the table could not be written
            print(refusal(path, busy), file=sys.stderr)
            return LOAD_REFUSED
        run = subprocess.run([sys.executable, *command], cwd=HERE.parent, capture_output=True, text=True)
        if run.returncode not in (0, TARGET_MISSED):  # it crashed (perhaps after a table): keep the last results
            sys.stderr.write(run.stdout + run.stderr)
            print(f"{name} failed (exit {run.returncode}); {path} left as it was", file=sys.stderr)
            return run.returncode
        load_end, waited_end = settled_load() if settle else (load_average(), 0.0)
        busy = {} if args.quick else too_busy({"start": load_start, "end": load_end})
        top = header(result, command, load_start, load_end, args.quick, args.device, forced=args.force and bool(busy),
                     waited=(waited_start, waited_end))
        text = top + "\n" + as_markdown(run.stdout) + "\n"
        if busy and not args.force:  # busy by the end: keep this run's table aside, not over the committed one
            kept = Path(tempfile.mkdtemp(prefix="bench-busy-")) / path.name
            kept.write_text(text)
            print(refusal(path, busy, kept), file=sys.stderr)
            return LOAD_REFUSED
        path.write_text(text)
        print(f"  -> {path}")
        if run.returncode == TARGET_MISSED:  # a ratio missed its target: a result, recorded
            print(f"  {name}: a target was missed (see the table)", file=sys.stderr)
            missed.append(name)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
