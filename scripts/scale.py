#!/usr/bin/env python3
"""Run the book's notebooks at another SCALE (and device), and record what they report.

    python scripts/scale.py --scale 2                                # every notebook with a knob
    python scripts/scale.py --scale 4 --device cuda book/10_bert.ipynb
    make scale SCALE=4 DEVICE=cuda NB=book/10_bert.ipynb              # the same through make

Each notebook runs top to bottom with ``BOOK_SCALE`` (and ``BOOK_DEVICE``) in its environment,
from ``book/`` as its working directory, into a scratch folder (``--scratch``, default
``_build/scale``): the notebooks in ``book/`` are never written. Two runners:

* ``kernel`` (default): a Jupyter kernel, as CI runs the book; the executed notebook is kept in
  the scratch folder.
* ``script``: the code cells joined into one Python file, run with this interpreter; for
  machines without Jupyter's kernel packages (a rented GPU box).

Per notebook it records the status (``ok`` or the error's last line), wall seconds, and the
headline numbers the chapter exports with ``companion.book.export_headlines``. The results are
merged into ``book/results/scale/scale-<S>-<device>.json`` (a rerun of one notebook replaces its
entry) and rendered as a Markdown table beside it, with the machine, torch version, date and the
command. Appendix C ("The book at scale") is built from these files.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
RESULTS = BOOK / "results" / "scale"
KNOB = "book_scale("


def has_knob(path: Path) -> bool:
    """Whether the notebook reads the book's SCALE knob."""
    nb = nbformat.read(path, as_version=4)
    return any(c.cell_type == "code" and KNOB in c.source for c in nb.cells)


def default_notebooks() -> list[Path]:
    return [p for p in sorted(BOOK.glob("*.ipynb")) if not p.name.startswith("_") and has_knob(p)]


def as_script(path: Path) -> str:
    """The notebook's code cells as one Python program (the book's notebooks use no magics)."""
    nb = nbformat.read(path, as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    return "from IPython.display import display  # noqa\n\n" + "\n\n".join(cells) + "\n"


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "failed"


def run_kernel(path: Path, env: dict, out: Path, timeout: int) -> str:
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:  # a cell the run never reaches must not show the stored SCALE 1 output
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    saved = dict(os.environ)
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        status = "ok"
    except CellExecutionError as err:
        status = f"{err.ename}: {err.evalue}".strip()[:300] if getattr(err, "ename", None) else last_line(str(err))
    except Exception as err:  # a timeout or a dead kernel: record it, go on with the next notebook
        status = f"{type(err).__name__}: {str(err)[:200]}"
    finally:
        os.environ.clear()
        os.environ.update(saved)
    nbformat.write(nb, out / path.name)
    return status


def run_script(path: Path, env: dict, out: Path, timeout: int) -> str:
    script = out / (path.stem + ".py")
    script.write_text(as_script(path), encoding="utf-8")
    log = out / (path.stem + ".log")
    try:
        proc = subprocess.run([sys.executable, str(script)], cwd=path.parent, env={**os.environ, **env},
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timeout after {timeout} s"
    log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr, encoding="utf-8")
    return "ok" if proc.returncode == 0 else last_line(proc.stderr)


def results_name(scale: int, device: str) -> str:
    return f"scale-{scale}-{device.replace(':', '')}"


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    text = f"{cpu}, {os.cpu_count()} cores"
    if torch.cuda.is_available():
        text += f"; {torch.cuda.get_device_name(0)}"
    return text


def render(results: dict) -> str:
    head = results["meta"]
    lines = [
        f"# The book at SCALE {head['scale']} on {head['device']}",
        "",
        f"Machine: {head['machine']}; torch {head['torch']}; {head['date']}.",
        f"Command: `{head['command']}`" + (f" ({head['note']})" if head.get("note") else ""),
        "",
        "| notebook | status | seconds | headline numbers |",
        "|---|---|---|---|",
    ]
    for name, entry in sorted(results["notebooks"].items()):
        nums = ", ".join(f"{k} = {fmt(v)}" for k, v in entry.get("numbers", {}).items()) or "none exported"
        lines.append(f"| {name} | {entry['status']} | {entry['seconds']:.0f} | {nums} |")
    return "\n".join(lines) + "\n"


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks (default: every one with a SCALE knob)")
    parser.add_argument("--scale", type=int, default=int(os.environ.get("BOOK_SCALE", 2) or 2),
                        help="the SCALE to run at (default $BOOK_SCALE, else 2)")
    parser.add_argument("--device", default=os.environ.get("BOOK_DEVICE") or None,
                        help="cpu, cuda, cuda:N or mps (default $BOOK_DEVICE, else the notebook's own choice)")
    parser.add_argument("--runner", choices=("kernel", "script"), default="kernel")
    parser.add_argument("--scratch", type=Path, default=ROOT / "_build" / "scale")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder for the results files")
    parser.add_argument("--note", default="", help="a note recorded with the run (e.g. 'two notebooks at a time')")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell (kernel) or notebook (script)")
    args = parser.parse_args(argv)
    if args.scale < 1:
        parser.error(f"--scale must be a positive integer, got {args.scale}")
    notebooks = [p.resolve() for p in args.notebooks] or default_notebooks()
    for p in notebooks:
        if not p.is_file() or p.suffix != ".ipynb":
            parser.error(f"not a notebook: {p}")
        if not has_knob(p):
            parser.error(f"{p.name} has no SCALE knob (book_scale(...)); nothing to scale")

    import torch

    device = args.device or ("cpu" if args.scale == 1 else
                             "cuda" if torch.cuda.is_available() else
                             "mps" if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
                             else "cpu")
    out = args.scratch / results_name(args.scale, device)
    out.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    json_path = args.results / (results_name(args.scale, device) + ".json")
    results = {"notebooks": {}}
    results["meta"] = {
        "scale": args.scale, "device": device, "machine": machine(), "torch": torch.__version__,
        "date": dt.date.today().isoformat(), "command": "python scripts/scale.py " + " ".join(argv or sys.argv[1:]),
        "note": args.note,
    }
    for path in notebooks:
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as tmp:
            record_file = Path(tmp.name)
        env = {"BOOK_SCALE": str(args.scale), "BOOK_DEVICE": device, "BOOK_RESULTS": str(record_file),
               "BOOK_CHAPTER": path.stem, "MPLBACKEND": "Agg", "TQDM_DISABLE": "1",
               "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
        print(f"{path.name}: SCALE={args.scale} on {device} ...", flush=True)
        start = time.perf_counter()
        runner = run_kernel if args.runner == "kernel" else run_script
        status = runner(path, env, out, args.timeout)
        seconds = time.perf_counter() - start
        numbers: dict = {}
        for line in record_file.read_text().splitlines():
            numbers.update(json.loads(line)["numbers"])
        record_file.unlink()
        print(f"  {status} in {seconds:.0f} s, {len(numbers)} headline numbers", flush=True)
        # re-read before writing: another run of the same scale may have recorded other notebooks meanwhile
        meta = results["meta"]
        results = json.loads(json_path.read_text()) if json_path.exists() else {"notebooks": {}}
        results["meta"] = meta
        results["notebooks"][path.stem] = {"status": status, "seconds": round(seconds, 1), "numbers": numbers}
        results["notebooks"] = dict(sorted(results["notebooks"].items()))
        json_path.write_text(json.dumps(results, indent=1) + "\n")
        json_path.with_suffix(".md").write_text(render(results))
    if not json_path.exists():  # nothing ran
        return 1
    results = json.loads(json_path.read_text())
    failed = [n for n, e in results["notebooks"].items() if e["status"] != "ok"]
    print(f"results: {json_path.relative_to(ROOT) if json_path.is_relative_to(ROOT) else json_path}"
          + (f"; failed: {', '.join(failed)}" if failed else "; all ok"))
    return 1 if any(results["notebooks"][p.stem]["status"] != "ok" for p in notebooks) else 0


if __name__ == "__main__":
    sys.exit(main())
