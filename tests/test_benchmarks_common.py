"""The benchmarks' shared rules: the status of a ratio against its target, and the load check of
``benchmarks/run_all.py`` that keeps a run on a busy machine from replacing a committed table.

No benchmark runs here: ``run_all``'s subprocess and the load average are replaced by stand-ins.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import common  # noqa: E402
import run_all  # noqa: E402
from common import BORDERLINE_MARGIN, MET, status  # noqa: E402


def test_the_margin_is_twenty_percent():
    assert BORDERLINE_MARGIN == pytest.approx(0.2)


@pytest.mark.parametrize(("value", "target", "expected"), [
    (6.5, 5, "ok"),  # past the target by more than the margin
    (6.0, 5, "ok"),  # exactly the margin: ok
    (5.9, 5, "borderline"),  # met by less than 20%
    (5.0, 5, "borderline"),  # met exactly
    (4.99, 5, "BELOW"),
    (1.18, 1.0, "borderline"),
    (0.5, 1.0, "BELOW"),
])
def test_status_when_higher_is_better(value, target, expected):
    assert status(value, target) == expected


@pytest.mark.parametrize(("value", "target", "expected"), [
    (0.90, 1.10, "ok"),  # 1.10 / 1.2 = 0.917: under it by more than the margin
    (0.97, 1.10, "borderline"),
    (1.10, 1.10, "borderline"),  # met exactly
    (1.11, 1.10, "OVER"),
    (1.38, 5, "ok"),
    (4.5, 5, "borderline"),
    (5.5, 5, "OVER"),
])
def test_status_when_lower_is_better(value, target, expected):
    assert status(value, target, higher_is_better=False) == expected


def test_a_time_ratio_and_its_inverse_get_the_same_status():
    for value in (0.5, 0.8, 0.84, 0.9, 0.95, 1.0, 1.05):
        slower = status(value, 0.9, higher_is_better=False)  # ours / reference, time
        faster = status(1 / value, 1 / 0.9)  # reference / ours, speed
        assert slower.replace("OVER", "BELOW") == faster, value


def test_a_round_that_misses_makes_a_met_median_borderline():
    assert status(9.45, 5, worst=8.68) == "ok"
    assert status(9.45, 5, worst=4.9) == "borderline"
    assert status(4.9, 5, worst=4.0) == "BELOW"  # a missed median stays a miss
    assert status(0.8, 1.1, higher_is_better=False, worst=1.0) == "ok"
    assert status(0.8, 1.1, higher_is_better=False, worst=1.2) == "borderline"
    assert status(1.2, 1.1, higher_is_better=False, worst=1.0) == "OVER"


def test_borderline_is_not_a_miss():
    assert set(MET) == {"ok", "borderline"}
    assert "BELOW" not in MET and "OVER" not in MET
    assert common.TARGET_MISSED not in (0, 1)


def test_no_benchmark_judges_a_ratio_by_itself():
    """Every status comes from common.status: no script compares a ratio with its target on its own."""
    own = re.compile(r'"(ok|borderline|BELOW|OVER)" if [^"\n]*[<>]|BORDERLINE =')  # a status chosen by a comparison
    found = [(p.name, m.group(0)) for p in sorted(BENCHMARKS.glob("*.py")) if p.name != "common.py"
             for m in own.finditer(p.read_text(encoding="utf-8"))]
    assert found == []


# ----------------------------------------------------------------------------- run_all's load check

TABLE = "\n| measure | ratio | status |\n|---|---|---|\n| x | 2.00x | ok |\n"
COMMITTED = "<!-- the committed table -->\n| measure | ratio | status |\n"


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """``run_all`` writing into ``tmp_path/results`` (a committed table there), with no real
    benchmark: the subprocess is a stand-in that records the commands it was given."""
    (tmp_path / "results").mkdir()
    committed = tmp_path / "results" / "gpt.md"
    committed.write_text(COMMITTED)
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    monkeypatch.setattr(run_all, "SETTLE_S", 0)  # no waiting for the load to fall
    ran: list[list[str]] = []

    def fake_run(command, **kwargs):
        ran.append(command)
        return subprocess.CompletedProcess(command, 0, stdout=TABLE, stderr="")

    monkeypatch.setattr(run_all.subprocess, "run", fake_run)
    return committed, ran


def loads(monkeypatch, *values: float) -> None:
    """``os.getloadavg`` returns these 1-minute averages in turn (the last one from then on)."""
    queue = list(values)
    monkeypatch.setattr(run_all.os, "getloadavg", lambda: (queue.pop(0) if len(queue) > 1 else queue[0], 0.0, 0.0))


def main(monkeypatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--only", "gpt", *argv])
    return run_all.main()


def test_a_quiet_run_replaces_the_committed_table(bench, monkeypatch):
    committed, ran = bench
    loads(monkeypatch, 0.2, 0.4)
    assert main(monkeypatch) == 0
    assert len(ran) == 1
    text = committed.read_text()
    assert "| x | 2.00x | ok |" in text
    assert "at the start: 0.20; at the end: 0.40\n" in text and "--force" not in text


def test_a_busy_start_refuses_before_running(bench, monkeypatch, capsys):
    committed, ran = bench
    loads(monkeypatch, 0.9)
    assert main(monkeypatch) == run_all.LOAD_REFUSED
    assert ran == []  # the benchmark never ran
    assert committed.read_text() == COMMITTED
    message = capsys.readouterr().err
    assert "0.90 at the start" in message and "--force" in message and "0.5" in message


def test_a_busy_end_keeps_the_committed_table(bench, monkeypatch, capsys):
    committed, ran = bench
    loads(monkeypatch, 0.3, 0.8)
    assert main(monkeypatch) == run_all.LOAD_REFUSED
    assert len(ran) == 1
    assert committed.read_text() == COMMITTED
    message = capsys.readouterr().err
    assert "0.80 at the end" in message and "--force" in message
    kept = Path(message.split("this run's table is in ")[1].split(".md")[0] + ".md")
    assert "| x | 2.00x | ok |" in kept.read_text()  # the run is not lost


def test_the_limit_itself_is_not_busy(bench, monkeypatch):
    committed, _ = bench
    loads(monkeypatch, 0.5, 0.5)
    assert main(monkeypatch) == 0
    assert "2.00x" in committed.read_text()


def test_force_writes_and_says_so(bench, monkeypatch):
    committed, ran = bench
    loads(monkeypatch, 1.4, 1.5)
    assert main(monkeypatch, "--force") == 0
    assert len(ran) == 1
    text = committed.read_text()
    assert "at the start: 1.40; at the end: 1.50 (above 0.5: written with `--force`)" in text
    assert "| x | 2.00x | ok |" in text


def test_force_on_a_quiet_machine_records_nothing_forced(bench, monkeypatch):
    committed, _ = bench
    loads(monkeypatch, 0.1, 0.1)
    assert main(monkeypatch, "--force") == 0
    assert "--force" not in committed.read_text()


def test_a_quick_run_is_never_refused_and_never_touches_the_results(bench, monkeypatch):
    committed, ran = bench
    loads(monkeypatch, 2.0)
    assert main(monkeypatch, "--quick") == 0
    assert ran and "--quick" in ran[0]
    assert committed.read_text() == COMMITTED


def test_the_load_is_read_once_the_benchmarks_own_load_has_decayed(monkeypatch):
    """A load above the limit is polled until it falls (here on the third reading)."""
    loads(monkeypatch, 1.9, 1.2, 0.45)
    monkeypatch.setattr(run_all.time, "sleep", lambda seconds: None)
    load, _ = run_all.settled_load()
    assert load == pytest.approx(0.45)


def test_the_real_header_records_a_forced_run(monkeypatch):
    monkeypatch.setattr(run_all, "cpu_model", lambda: "a CPU")
    monkeypatch.setattr(run_all, "versions", lambda: "torch x")
    top = run_all.header("gpt", ["benchmarks/gpt.py"], 0.9, 1.1, forced=True, waited=(0.0, 95.0))
    assert "at the start: 0.90; at the end: 1.10 (after 95 s for the load to settle) (above 0.5: written with " \
           "`--force`)" in top
    assert "n/a" in run_all.shown(None)
