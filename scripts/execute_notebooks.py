#!/usr/bin/env python3
"""Re-execute book notebooks in place, top to bottom, on CPU, the way CI checks them.

    python scripts/execute_notebooks.py                      # every notebook under book/
    python scripts/execute_notebooks.py book/01_why_transformers.ipynb

Each notebook runs in a fresh kernel with its own folder as the working directory (as nbval and
Jupyter Book run it), with CUDA hidden so the stored outputs are the CPU ones. The wall time of
each is printed against the book's per-notebook budget of 120 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 120.0


def execute(path: Path, timeout: int) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
    ).execute()
    elapsed = time.perf_counter() - start
    nbformat.write(nb, path)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: all under book/)")
    parser.add_argument("--timeout", type=int, default=600, help="per-cell timeout in seconds")
    args = parser.parse_args()

    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # stored outputs are the CPU ones
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    notebooks = args.notebooks or sorted(
        p for p in (ROOT / "book").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
    )
    over = []
    for path in notebooks:
        if path.suffix != ".ipynb" or not path.exists():
            print(f"error: {path} is not a notebook", file=sys.stderr)
            return 2
        elapsed = execute(path.resolve(), args.timeout)
        flag = "" if elapsed <= BUDGET_S else f"  OVER the {BUDGET_S:.0f} s budget"
        print(f"{elapsed:7.1f} s  {path}{flag}", flush=True)
        if flag:
            over.append(path)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
