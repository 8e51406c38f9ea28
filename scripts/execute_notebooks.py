#!/usr/bin/env python3
"""Re-execute book notebooks in place, top to bottom, on CPU, the way CI checks them.

    python scripts/execute_notebooks.py                      # every notebook under book/
    python scripts/execute_notebooks.py book/01_why_transformers.ipynb

Each notebook runs in a fresh kernel with its own folder as the working directory (as nbval and
Jupyter Book run it), with CUDA hidden so the stored outputs are the CPU ones, and with progress
bars hidden (``TQDM_DISABLE=1``, as in the test runs) so the stored outputs hold no progress
frames. A notebook that writes anything else to stderr (a warning) is an error: GitHub and Colab
show the raw outputs. The wall time of each is printed against the book's per-notebook budget of
120 s on 2 CPU cores.
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


def stderr_outputs(nb) -> list[str]:
    """``"cell N: text"`` for every stderr output of the executed notebook."""
    found = []
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                found.append(f"cell {index}: {out['text'].strip()[:300]}")
    return found


def execute(path: Path, timeout: int) -> tuple[float, list[str]]:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
    ).execute()
    elapsed = time.perf_counter() - start
    nbformat.write(nb, path)
    return elapsed, stderr_outputs(nb)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: all under book/)")
    parser.add_argument("--timeout", type=int, default=600, help="per-cell timeout in seconds")
    args = parser.parse_args()

    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # stored outputs are the CPU ones
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    for name in ("BOOK_SCALE", "BOOK_DEVICE", "BOOK_RESULTS", "BOOK_CHAPTER"):  # stored outputs: SCALE = 1, CPU
        os.environ.pop(name, None)
    os.environ["TQDM_DISABLE"] = "1"  # as in the test runs (conftest.py): no progress frames stored
    notebooks = args.notebooks or sorted(
        p for p in (ROOT / "book").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
    )
    over, noisy = [], []
    for path in notebooks:
        if path.suffix != ".ipynb" or not path.exists():
            print(f"error: {path} is not a notebook", file=sys.stderr)
            return 2
        elapsed, stderr = execute(path.resolve(), args.timeout)
        flag = "" if elapsed <= BUDGET_S else f"  OVER the {BUDGET_S:.0f} s budget"
        print(f"{elapsed:7.1f} s  {path}{flag}", flush=True)
        for line in stderr:
            print(f"    stderr in {path.name}, {line}", file=sys.stderr)
        if flag:
            over.append(path)
        if stderr:
            noisy.append(path)
    return 1 if over or noisy else 0


if __name__ == "__main__":
    sys.exit(main())
