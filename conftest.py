"""pytest set-up shared by the package tests (``tests/``) and nbval's notebook runs (``book/``).

nbval starts each notebook's kernel with this process's environment, so what is set here is what
the notebooks see when they are checked:

* ``TQDM_DISABLE=1``: progress bars are hidden, so the re-executed cells print exactly what the
  committed notebooks store (no progress frames; a reader running a cell still sees its bar).
* Hugging Face's offline switches, before anything imports ``datasets``: nothing may download.
* No ``BOOK_SCALE``/``BOOK_DEVICE``/``BOOK_RESULTS``: the stored outputs are those of ``SCALE = 1``
  on the CPU, whatever a reader's shell has set (``scripts/scale.py`` runs other scales).
"""

import os

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_UPDATE_DOWNLOAD_COUNTS", "0")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # no debugger notice on the kernels' stderr
for _name in ("BOOK_SCALE", "BOOK_DEVICE", "BOOK_RESULTS", "BOOK_CHAPTER"):
    os.environ.pop(_name, None)



# Each notebook's wall time as nbval checks it (kernel start, every cell, shutdown), summed from the
# test reports and printed at the end against the book's budget of 120 s per notebook at SCALE = 1.
# A report, not a test: a slow machine must not fail the run (see CONTRIBUTING.md, "CI and its time budget").
NOTEBOOK_BUDGET_S = 120.0
_notebook_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        _notebook_seconds[path] = _notebook_seconds.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _notebook_seconds:
        return
    kernels = "generic" if os.environ.get("ATEN_CPU_CAPABILITY") == "default" else "this machine's"
    terminalreporter.section(f"seconds per notebook ({kernels} CPU kernels; budget {NOTEBOOK_BUDGET_S:.0f} s)")
    for path, seconds in sorted(_notebook_seconds.items()):
        flag = "" if seconds <= NOTEBOOK_BUDGET_S else "  over the budget"
        terminalreporter.write_line(f"{seconds:7.1f} s  {path}{flag}")
