"""The book as readers meet it: one repository address, launchable notebooks, CI where it is hosted.

The browser check of the built HTML is ``make check-html`` (scripts/check_html.py), run by CI after
the book is built; these tests check the configuration it relies on, without building anything.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "_ext"))

import colab_cell  # noqa: E402
import offline_html  # noqa: E402

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
URL = CONFIG["repository"]["url"]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))


def test_the_repository_address_is_set_once_and_repeated_faithfully():
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", URL), URL
    github = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+")
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    assert "git clone {{ repository_url }}" in intro  # the landing page reads _config.yml
    assert not github.findall(intro), "book/intro.md must use {{ repository_url }}, not a literal address"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"git clone {URL}" in readme
    for path in NOTEBOOKS:
        for found in github.findall(path.read_text(encoding="utf-8")):
            assert found.startswith(URL) or "git+" not in found, (path.name, found)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_installs_companion_when_launched_elsewhere(notebook):
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    assert colab_cell.has_cell(nb, URL), "run scripts/colab_cell.py"
    first = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert "remove-cell" in first["metadata"].get("tags", [])
    assert first["outputs"] == []  # where companion is installed it prints nothing


def test_the_install_cell_is_plain_python_that_installs_only_when_needed():
    code = colab_cell.source(URL)
    compile(code, "<install cell>", "exec")  # no IPython magics: it runs anywhere
    ran: list = []
    exec(code.replace("subprocess.run(", "ran.append("), {"ran": ran})
    assert ran == []  # companion is importable here, so nothing is installed


def test_the_set_repository_script_rewrites_every_copy(tmp_path):
    import set_repository

    for path in set_repository.files_repeating_the_url():
        if path.suffix != ".ipynb" and URL not in path.read_text(encoding="utf-8"):
            pytest.fail(f"{path.name} is listed but does not repeat the address")
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "set_repository.py"), "not-a-url"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "https://github.com/OWNER/REPO" in bad.stderr


def test_launch_buttons_and_binder_environment():
    buttons = CONFIG["launch_buttons"]
    assert buttons["colab_url"] == "https://colab.research.google.com"
    assert buttons["binderhub_url"] == "https://mybinder.org"
    requirements = (ROOT / "binder" / "requirements.txt").read_text(encoding="utf-8")
    # the book extra, and the test extra for transformers, which Chapters 10-12 import (from_hf sections)
    assert "torch==" in requirements and "-e .[book,test]" in requirements


def test_mathjax_is_served_from_the_build_not_a_cdn():
    source = offline_html.mathjax_source()
    assert (source / "MathJax.js").exists()
    assert (source / "config" / "TeX-AMS-MML_HTMLorMML-full.js").exists()
    assert (source / "fonts" / "HTML-CSS" / "STIX-Web" / "woff").is_dir()
    assert "offline_html" in CONFIG["sphinx"]["local_extensions"]


def _make_targets(command: str) -> list[str]:
    return re.findall(r"\bmake ([\w-]+)", command)


def test_the_workflows_run_what_ci_runs():
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    expected = [t for line in lines if not line.lstrip().startswith("#") for t in _make_targets(line)]
    assert expected == ["test", "lint", "book", "check-html"], expected
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8"))
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key `on` as True
    assert {"push", "pull_request"} <= set(triggers)
    steps = [s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"]]
    ran = [t for command in steps for t in _make_targets(command)]
    assert ran == expected, (ran, expected)
    assert any("torch==2.13.0" in s for s in steps)
    pages = yaml.safe_load((ROOT / ".github" / "workflows" / "pages.yml").read_text(encoding="utf-8"))
    page_steps = [s for job in pages["jobs"].values() for s in job["steps"]]
    assert any(_make_targets(s.get("run", "")) == ["book"] for s in page_steps)
    assert any(s.get("uses", "").startswith("actions/upload-pages-artifact") and s["with"]["path"] == "_build/html"
               for s in page_steps)
    assert any(s.get("uses", "").startswith("actions/deploy-pages") for s in page_steps)


def test_appendix_b_renders_the_committed_benchmark_results():
    nb = json.loads((ROOT / "book" / "B_performance.ipynb").read_text(encoding="utf-8"))
    shown = "\n".join("".join(o.get("data", {}).get("text/markdown", "")) for c in nb["cells"]
                      if c["cell_type"] == "code" for o in c.get("outputs", []))
    for name in ("attention", "bpe", "gpt", "gpt-cuda"):
        text = (ROOT / "benchmarks" / "results" / f"{name}.md").read_text(encoding="utf-8")
        body = "\n".join(line for line in text.splitlines() if not line.startswith("<!--"))
        assert "**machine**" in body
        assert body in shown, f"Appendix B shows stale {name} results: re-execute book/B_performance.ipynb"


def test_the_link_check_finds_broken_links_and_missing_anchors(tmp_path, monkeypatch):
    import check_html

    (tmp_path / "a.html").write_text('<p id="here">x</p><a href="b.html#there">b</a><a href="#here">self</a>'
                                     '<img src="_images/fig.png"><a href="https://example.org">out</a>'
                                     '<a href="missing.html">gone</a>', encoding="utf-8")
    (tmp_path / "b.html").write_text('<h1 id="elsewhere">b</h1>', encoding="utf-8")
    monkeypatch.chdir(tmp_path.parent)  # the build directory as CI passes it: a relative path
    build = Path(tmp_path.name)
    problems = check_html.broken_links(build, build / "a.html", {})
    assert sorted(problems) == sorted([
        "<a> b.html#there: no id 'there' in b.html",
        "<img> _images/fig.png: no such file in the build",
        "<a> missing.html: no such file in the build",
    ])
    (tmp_path / "_images").mkdir()
    (tmp_path / "_images" / "fig.png").write_bytes(b"png")
    (tmp_path / "b.html").write_text('<h1 id="there">b</h1>', encoding="utf-8")
    remaining = check_html.broken_links(build, build / "a.html", {})
    assert remaining == ["<a> missing.html: no such file in the build"]


def test_every_chapter_of_the_toc_is_on_the_landing_page():
    import check_html

    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\{doc\}`([^`<]+)`", intro))
    for chapter in check_html.toc_chapters():
        assert Path(chapter).name in linked, f"book/intro.md does not link {chapter}"
