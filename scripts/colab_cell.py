#!/usr/bin/env python3
"""Give every notebook in book/ the cell that installs ``companion`` on Colab (idempotent).

    python3 scripts/colab_cell.py                  # add or update the cell where needed
    python3 scripts/colab_cell.py book/X.ipynb     # only these notebooks
    python3 scripts/colab_cell.py --check          # exit 1 if a notebook lacks it

A chapter opened from its launch button on Colab runs in a fresh environment without the book's
package. The first code cell of every notebook therefore installs it from the repository named in
``_config.yml`` when it is not importable; where it is installed (a clone, Binder, CI) the cell does
nothing and prints nothing. The cell is tagged ``remove-cell``, so the book's pages do not show it.
Inserting it renumbers the stored execution counts, so notebooks stay "executed in order".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from set_repository import current_url

ROOT = Path(__file__).resolve().parents[1]
TAG = "remove-cell"
MARKER = "# Colab: install the book's package"


def source(url: str) -> str:
    return (f"{MARKER} (where it is installed, this cell does nothing).\n"
            "import importlib.util\n"
            "import subprocess\n"
            "import sys\n"
            "\n"
            "if importlib.util.find_spec(\"companion\") is None:\n"
            "    package = \"git+" + url + "\"\n"
            "    subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"--quiet\", package], check=True)")


def install_cell(url: str, count: int | None, with_id: bool) -> dict:
    cell = {"cell_type": "code", "execution_count": count, "metadata": {"tags": [TAG]}, "outputs": [],
            "source": source(url).splitlines(keepends=True)}
    if with_id:  # cell ids exist from nbformat 4.5 on
        cell["id"] = "colab-install"
    return cell


def has_cell(nb: dict, url: str) -> bool:
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    return bool(code) and "".join(code[0]["source"]) == source(url)


def add_cell(nb: dict, url: str) -> None:
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    if code and "".join(code[0]["source"]).startswith(MARKER):  # an older version: replace it
        code[0]["source"] = source(url).splitlines(keepends=True)
        return
    executed = bool(code) and all(c.get("execution_count") is not None for c in code)
    for c in code:  # renumber: the new cell runs first
        if executed:
            c["execution_count"] += 1
            for out in c.get("outputs", []):
                if "execution_count" in out:
                    out["execution_count"] = c["execution_count"]
    first = nb["cells"].index(code[0]) if code else len(nb["cells"])
    with_id = (nb.get("nbformat", 4), nb.get("nbformat_minor", 0)) >= (4, 5)
    nb["cells"].insert(first, install_cell(url, 1 if executed else None, with_id))


def main(check: bool, paths: list[Path]) -> int:
    url = current_url()
    missing = []
    for path in paths or sorted((ROOT / "book").glob("*.ipynb")):
        path = path.resolve()
        nb = json.loads(path.read_text(encoding="utf-8"))
        if has_cell(nb, url):
            continue
        missing.append(path.name)
        if not check:
            add_cell(nb, url)
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            print(f"added the install cell to {path.relative_to(ROOT)}")
    if check and missing:
        print("notebooks without the Colab install cell (run scripts/colab_cell.py):", *missing, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main("--check" in args, [Path(a) for a in args if a != "--check"]))
