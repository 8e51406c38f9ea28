"""Static checks of the committed notebooks: what readers see on GitHub, Colab and in the book.

nbval (``make test``) re-executes every notebook and compares outputs; these checks are about the
files themselves and take a second: executed top to bottom, no test plumbing or progress frames
in what readers see, figures' code folded away, and no words from the planning documents the
book was written from (readers do not have them; the book cites the literature).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (ROOT / "book").glob("*.ipynb"))
# Tags the book uses: nbval's, and Jupyter Book's display tags.
KNOWN_TAGS = {"nbval-ignore-output", "nbval-skip", "raises-exception", "hide-input", "hide-output", "hide-cell",
              "remove-input", "remove-output", "remove-cell"}
# The planning documents' vocabulary: "the seeds", "seed 000 §2", "001 ch 4", "the issue".
INTERNAL = re.compile(r"\bthe seeds\b|\bseeds'|\bseed 00\d|\b00\d\s*(ch\b|§)|\bthe issue\b|BOOK_PLAN|CHAPTER_GUIDE",
                      flags=re.IGNORECASE)


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def output_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append("".join(out["text"]))
        for mime in ("text/plain", "text/markdown", "text/html"):
            parts.append("".join(out.get("data", {}).get(mime, "")))
    return "\n".join(parts)


def internal_mentions(text: str) -> list[str]:
    return [m.group(0) for m in INTERNAL.finditer(text)]


@pytest.fixture(params=NOTEBOOKS, ids=lambda p: p.name)
def notebook(request) -> Path:
    return request.param


def test_every_notebook_is_in_the_table_of_contents(notebook):
    assert f"book/{notebook.stem}" in (ROOT / "_toc.yml").read_text(encoding="utf-8")


def test_executed_top_to_bottom(notebook):
    counts = [c.get("execution_count") for c in cells(notebook) if c["cell_type"] == "code" and source(c).strip()]
    assert counts == list(range(1, len(counts) + 1)), "re-execute it: make execute NB=" + str(notebook)


def test_no_errors_warnings_or_progress_frames_stored(notebook):
    """Stored outputs are what GitHub and Colab show: no stderr (tqdm frames, warnings), no errors."""
    bad = [
        (i, out.get("name", out["output_type"]), "".join(out.get("text", out.get("evalue", "")))[:120])
        for i, c in enumerate(cells(notebook)) for out in c.get("outputs", [])
        if out["output_type"] == "error" or (out["output_type"] == "stream" and out["name"] == "stderr")
    ]
    assert bad == []


def test_no_test_plumbing_in_visible_code(notebook):
    """nbval is steered by cell tags (``nbval-ignore-output``), never by comments readers would see."""
    plumbing = [i for i, c in enumerate(cells(notebook)) if re.search(r"#\s*NBVAL_|PYTEST_VALIDATE", source(c))]
    assert plumbing == []
    unknown = {t for c in cells(notebook) for t in c.get("metadata", {}).get("tags", [])} - KNOWN_TAGS
    assert unknown == set()


def test_figure_only_cells_fold_their_code(notebook):
    """A cell whose only output is a figure shows the figure; its plotting code is one click away."""
    unfolded = []
    for i, c in enumerate(cells(notebook)):
        outs = c.get("outputs", [])
        figures = [o for o in outs if "image/png" in o.get("data", {})]
        tags = set(c.get("metadata", {}).get("tags", []))
        if figures and len(figures) == len(outs) and not tags & {"hide-input", "hide-cell", "remove-input"}:
            unfolded.append(i)
    assert unfolded == [], "tag these cells hide-input"


def test_no_planning_vocabulary(notebook):
    found = [(i, m) for i, c in enumerate(cells(notebook)) for m in internal_mentions(source(c) + output_text(c))]
    assert found == []


def test_no_planning_vocabulary_in_pages_and_ledger():
    pages = [*(ROOT / "book").glob("*.md"), ROOT / "book" / "claims.yml", ROOT / "README.md"]
    found = [(p.name, m) for p in pages for m in internal_mentions(p.read_text(encoding="utf-8"))]
    assert found == []


def test_the_vocabulary_check_can_fail():
    assert internal_mentions("as the seeds say") == ["the seeds"]
    assert internal_mentions("see seed 000 §3.2") == ["seed 000"]
    assert internal_mentions("(001 ch 6; 003 RoPE)") == ["001 ch"]
    assert internal_mentions("averaged over three random seeds; seed 0 and seed 1") == []
