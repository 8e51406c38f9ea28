#!/usr/bin/env python3
"""Point the book at another repository (a fork): ``python3 scripts/set_repository.py URL``.

The address is set once, as ``repository: url:`` in ``_config.yml``; the book's pages read it from
there (``_ext/repository_url.py``), and so do the launch buttons. This script rewrites that value
and the places that must repeat it because they are read outside the book: the README's
``git clone`` line and each notebook's first cell, which installs ``companion`` from the
repository when a chapter runs on Colab. ``tests/test_publishing.py`` checks that they agree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def current_url() -> str:
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))["repository"]["url"]


def files_repeating_the_url() -> list[Path]:
    return [ROOT / "_config.yml", ROOT / "README.md", *sorted((ROOT / "book").glob("*.ipynb"))]


def main(new: str) -> int:
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", new):
        print(f"URL must look like https://github.com/OWNER/REPO, got {new!r}", file=sys.stderr)
        return 2
    old = current_url()
    for path in files_repeating_the_url():
        text = path.read_text(encoding="utf-8")
        if old in text:
            path.write_text(text.replace(old, new), encoding="utf-8")
            print(f"updated {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
