"""The book's SCALE knob (companion.book) and the script that runs notebooks at another scale
(scripts/scale.py), on a tiny notebook written here."""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

from companion.book import book_device, book_scale, export_headlines

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("BOOK_SCALE", "BOOK_DEVICE", "BOOK_RESULTS", "BOOK_CHAPTER"):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    torch.set_flush_denormal(False)  # book_device(...) on the CPU switches it on; PyTorch's default is off


def _flushes_subnormals() -> bool:
    # 1e-40 is subnormal in float32; with flushing on, an operation on it gives exactly 0
    return (torch.tensor([1e-40]) * 1.0).item() == 0.0


def test_book_scale_reads_the_environment_over_the_cell(clean_env):
    assert book_scale(1) == 1 and book_scale(3) == 3
    clean_env.setenv("BOOK_SCALE", "4")
    assert book_scale(1) == 4
    for bad in ("0", "-2", "two", "1.5"):
        clean_env.setenv("BOOK_SCALE", bad)
        with pytest.raises(ValueError, match="BOOK_SCALE"):
            book_scale(1)
    for bad in (0, -1, 1.0, True, "1"):
        with pytest.raises(ValueError, match="default"):
            book_scale(bad)


def test_book_device_is_the_cpu_at_scale_one_unless_told(clean_env):
    assert book_device(1) == torch.device("cpu")
    best = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert book_device(2).type == best
    clean_env.setenv("BOOK_DEVICE", "cpu")
    assert book_device(4) == torch.device("cpu")
    clean_env.setenv("BOOK_DEVICE", "tpu")
    with pytest.raises(ValueError, match="prefer"):
        book_device(1)
    with pytest.raises(ValueError, match="scale"):
        book_device(0)


def test_book_device_flushes_subnormals_on_the_cpu(clean_env):
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush subnormal floats (no SSE3)")
    assert not _flushes_subnormals()
    assert book_device(1).type == "cpu"
    assert _flushes_subnormals()


def test_export_headlines_writes_only_when_asked(clean_env, tmp_path):
    numbers = {"loss": torch.tensor(1.25), "accs": [0.5, torch.tensor(0.75)], "n": 3, "name": "x", "nan": float("nan")}
    assert export_headlines(numbers, device="cpu") is None  # a cell ending with the call shows nothing
    target = tmp_path / "h.jsonl"
    clean_env.setenv("BOOK_RESULTS", str(target))
    clean_env.setenv("BOOK_SCALE", "2")
    export_headlines(numbers, device=torch.device("cpu"), chapter="ch")
    export_headlines({"b": 2})
    first, second = (json.loads(line) for line in target.read_text().splitlines())
    assert first == {"chapter": "ch", "scale": 2, "device": "cpu",
                     "numbers": {"loss": 1.25, "accs": [0.5, 0.75], "n": 3, "name": "x", "nan": "nan"}}
    assert second["numbers"] == {"b": 2} and second["chapter"] == "unknown"
    with pytest.raises(ValueError, match="numbers"):
        export_headlines({})
    with pytest.raises(ValueError, match="'obj'"):
        export_headlines({"obj": object()})


def _notebook(path: Path, cells: list[str]) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("runner", ["script", "kernel"])
def test_the_scale_script_runs_notebooks_and_records_their_numbers(tmp_path, runner, clean_env):
    good = _notebook(tmp_path / "good.ipynb", [
        "from companion.book import book_device, book_scale, export_headlines\n"
        "SCALE = book_scale(1)\ndevice = book_device(SCALE)",
        "steps = 10 * SCALE\nassert steps >= 10",
        "export_headlines({'steps': steps, 'device_type': device.type}, device=device)",
    ])
    bad = _notebook(tmp_path / "bad.ipynb", [
        "from companion.book import book_scale\nSCALE = book_scale(1)",
        "assert SCALE == 1, 'only the CPU budget'",
    ])
    plain = _notebook(tmp_path / "plain.ipynb", ["x = 1"])
    results, scratch = tmp_path / "results", tmp_path / "scratch"
    cmd = [sys.executable, str(ROOT / "scripts" / "scale.py"), "--scale", "3", "--device", "cpu", "--runner", runner,
           "--results", str(results), "--scratch", str(scratch), "--timeout", "120"]
    proc = subprocess.run([*cmd, str(good), str(bad)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one notebook failed
    recorded = json.loads((results / "scale-3-cpu.json").read_text())
    assert recorded["meta"]["scale"] == 3 and recorded["meta"]["device"] == "cpu"
    assert recorded["meta"]["torch"] == torch.__version__
    assert recorded["notebooks"]["good"]["status"] == "ok"
    assert recorded["notebooks"]["good"]["numbers"] == {"steps": 30, "device_type": "cpu"}
    assert "only the CPU budget" in recorded["notebooks"]["bad"]["status"]
    assert recorded["notebooks"]["bad"]["numbers"] == {}
    table = (results / "scale-3-cpu.md").read_text()
    assert "| good | ok |" in table and "steps = 30" in table
    assert all(not c.get("outputs") for c in nbformat.read(good, as_version=4).cells)  # never run in place
    kept = scratch / "scale-3-cpu" / ("good.ipynb" if runner == "kernel" else "good.log")
    assert kept.is_file()  # what ran is kept in the scratch folder
    # a rerun of one notebook replaces its entry and keeps the others
    proc = subprocess.run([*cmd, str(good)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = json.loads((results / "scale-3-cpu.json").read_text())
    assert set(again["notebooks"]) == {"good", "bad"} and again["notebooks"]["good"]["status"] == "ok"
    # a notebook without the knob is refused, with its name
    proc = subprocess.run([*cmd, str(plain)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "plain.ipynb has no SCALE knob" in proc.stderr
