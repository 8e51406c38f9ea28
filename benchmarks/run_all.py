#!/usr/bin/env python3
"""Run every benchmark and store its tables in ``benchmarks/results/`` (``make bench``).

    python benchmarks/run_all.py                 # the full runs (several minutes on 2 cores)
    python benchmarks/run_all.py --quick         # smaller shapes, a smoke test (tables to a temporary folder)
    python benchmarks/run_all.py --only gpt      # one benchmark
    python benchmarks/run_all.py --only gpt --device cuda   # on a GPU: results/gpt-cuda.md

Each result file is the benchmark's own Markdown output under a header that records the machine
it ran on (CPU model, cores, load average at its start and end), the PyTorch version, the command and the
date. Appendix B (``book/B_performance.ipynb``) renders these files as committed; run this on a
quiet machine, then re-execute the appendix (``make execute NB=book/B_performance.ipynb``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from common import TARGET_MISSED

HERE = Path(__file__).resolve().parent
BENCHMARKS = {
    "attention": ["attention.py"],
    "bpe": ["bpe.py"],
    "gpt": ["gpt.py"],
}
QUICK = {"attention": ["--quick"], "bpe": ["--vocab-size", "2048", "--naive-vocab", "512", "--repeats", "1"],
         "gpt": ["--quick"]}


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
    for package in ("transformers", "tokenizers"):
        try:
            found.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def load_average() -> str:
    """The 1-minute load average, where the system reports one."""
    return f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "n/a"


def gpu_model() -> str:
    """The GPU's name, memory and CUDA version, e.g. ``NVIDIA H200 (139 GiB), CUDA 13.0``."""
    props = torch.cuda.get_device_properties(0)
    return f"{props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"


def header(name: str, command: list[str], load_start: str, load_end: str, quick: bool = False,
           device: str = "cpu") -> str:
    if quick:
        written = f"{name}.md: a smoke test by `benchmarks/run_all.py --quick` (smaller shapes), not the committed ones"
    elif device == "cpu":
        written = f"benchmarks/results/{name}.md: written by `make bench` (benchmarks/run_all.py)"
    else:
        written = f"benchmarks/results/{name}.md: written by `benchmarks/run_all.py --device {device}`"
    gpu = [f"- **GPU**: {gpu_model()}"] if device == "cuda" else []
    return "\n".join([
        f"<!-- {written} -->",
        *gpu,
        f"- **machine**: {cpu_model()}, {os.cpu_count()} logical cores, {platform.system()} {platform.release()}"
        f"; PyTorch's CPU kernels: {torch.backends.cpu.get_cpu_capability()}",
        f"- **software**: Python {platform.python_version()}, {versions()}",
        f"- **load average** (1 min) at the start: {load_start}; at the end: {load_end}",
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
        load_start = load_average()
        run = subprocess.run([sys.executable, *command], cwd=HERE.parent, capture_output=True, text=True)
        if run.returncode not in (0, TARGET_MISSED):  # it crashed (perhaps after a table): keep the last results
            sys.stderr.write(run.stdout + run.stderr)
            print(f"{name} failed (exit {run.returncode}); {out / (result + '.md')} left as it was", file=sys.stderr)
            return run.returncode
        top = header(result, command, load_start, load_average(), args.quick, args.device)
        (out / f"{result}.md").write_text(top + "\n" + as_markdown(run.stdout) + "\n")
        print(f"  -> {out / (result + '.md')}")
        if run.returncode == TARGET_MISSED:  # a ratio missed its target: a result, recorded
            print(f"  {name}: a target was missed (see the table)", file=sys.stderr)
            missed.append(name)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
