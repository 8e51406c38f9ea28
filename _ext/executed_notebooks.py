"""Sphinx extension: render committed outputs, execute only notebooks that were never executed.

myst-nb's ``auto`` mode re-executes a notebook if *any* code cell has no output, which is true
of nearly every notebook (a cell that only defines a function prints nothing). The book's rule
is different: notebooks are committed executed top to bottom, so a notebook whose code cells all
carry an execution count is rendered as stored, and only a notebook with unexecuted cells (a
new chapter) is executed during the build. This extension adds the executed notebooks to
``nb_execution_excludepatterns`` before myst-nb reads its configuration.
"""

from __future__ import annotations

import json
from pathlib import Path


def _fully_executed(path: Path) -> bool:
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    code = [c for c in cells if c.get("cell_type") == "code" and "".join(c.get("source", [])).strip()]
    return bool(code) and all(c.get("execution_count") is not None for c in code)


def _exclude_executed(app, config) -> None:
    root = Path(app.srcdir)
    executed = [
        p.relative_to(root).as_posix()
        for p in sorted(root.glob("book/**/*.ipynb"))
        if ".ipynb_checkpoints" not in p.parts and _fully_executed(p)
    ]
    config.nb_execution_excludepatterns = list(config.nb_execution_excludepatterns or []) + executed


def setup(app):
    app.connect("config-inited", _exclude_executed, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
