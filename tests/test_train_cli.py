"""``python -m companion.train``: a run killed at any step resumes to the weights of a run never
killed, bit for bit (1 process, and 2 under torchrun with DDP and FSDP); 2 processes equal 1; bad
arguments, refused resumes and damaged checkpoints get one clear line.

These tests launch real processes, as a reader would: ``torchrun --standalone --nproc_per_node=2``
with the gloo backend on the CPU, and a real ``kill -9``. Each run is a few dozen optimizer steps
of the ``tiny`` preset.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from companion.train import parse_args, run
from companion.training.checkpoint import checkpoint_path, list_checkpoints, read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--preset", "tiny", "--batch-size", "8", "--context", "32", "--seed", "3", "--device", "cpu"]
STEPS, SAVE_EVERY = 48, 4
MODES = {"single": ([], 1), "ddp": ([], 2), "fsdp": (["--fsdp"], 2)}


def _command(out: Path, *extra: str, processes: int = 1) -> list[str]:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
                if processes > 1 else [sys.executable])
    return [*launcher, "-m", "companion.train", *COMMON, "--out", str(out), *extra]


ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _launch(out: Path, *extra: str, processes: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run(_command(out, *extra, processes=processes), cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=600)


def _weights(out: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return read_checkpoint(checkpoint_path(out, step))["model"]


def _step_losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (Linux /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += parents.get(p, [])
    return found


def _kill_9_after_a_checkpoint(out: Path, extra: list[str], processes: int, rng: random.Random) -> int:
    """Start a run, wait for a checkpoint at or after a random step, then SIGKILL the launcher and
    every worker at once (frozen first, so none outlives the others); return the newest checkpoint's step."""
    proc = subprocess.Popen(_command(out, *extra, processes=processes), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    target = rng.randrange(SAVE_EVERY, STEPS // 2)
    deadline = time.monotonic() + 300
    while not (list_checkpoints(out) and list_checkpoints(out)[-1][0] >= target):
        assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stderr.read()}"
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.05))  # anywhere in a step, or in the middle of writing the next checkpoint
    tree = _descendants(proc.pid)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in tree:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return list_checkpoints(out)[-1][0]


def _run_each_mode(tmp_path_factory, name: str, *extra: str) -> dict[str, Path]:
    outs = {}
    for mode, (mode_extra, processes) in MODES.items():
        outs[mode] = tmp_path_factory.mktemp(f"{name}-{mode}")
        result = _launch(outs[mode], *extra, *mode_extra, processes=processes)
        assert result.returncode == 0, result.stderr
        assert f"steps on {processes} process(es)" in result.stdout
    return outs


KILL_RUN = ("--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--dropout", "0.1")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, Path]:
    """The reference runs: STEPS steps without interruption, in each mode, with dropout (so that a
    resume must restore every process's random state to match)."""
    return _run_each_mode(tmp_path_factory, "uninterrupted", *KILL_RUN)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory) -> dict[str, Path]:
    """6 steps without dropout in each mode."""
    return _run_each_mode(tmp_path_factory, "replica", "--steps", "6")


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_train_as_one(replicas, mode):
    # The same global batches: 2 processes compute the gradient 1 process does, to rounding.
    one, two = _step_losses(replicas["single"]), _step_losses(replicas[mode])
    assert one.keys() == two.keys() == set(range(1, 7))
    assert max(abs(one[s] - two[s]) for s in one) < 1e-5
    one, two = _weights(replicas["single"], 6), _weights(replicas[mode], 6)
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_run_killed_with_sigkill_resumes_bit_for_bit(uninterrupted, tmp_path, mode):
    extra, processes = MODES[mode]
    rng = random.Random(f"kill-{mode}")
    args = [*KILL_RUN, *extra]
    killed_at = _kill_9_after_a_checkpoint(tmp_path, args, processes, rng)
    assert SAVE_EVERY <= killed_at < STEPS
    result = _launch(tmp_path, *args, "--resume", processes=processes)
    assert result.returncode == 0, result.stderr
    assert f"resuming from {checkpoint_path(tmp_path, killed_at)}" in result.stdout + result.stderr
    straight, resumed = _weights(uninterrupted[mode]), _weights(tmp_path)
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight), "resumed weights differ"
    # The log reads as one run: the steps the killed run did after its last checkpoint were dropped.
    assert _step_losses(tmp_path) == _step_losses(uninterrupted[mode])
    assert len(list_checkpoints(tmp_path)) == 3  # --keep's default


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_and_stops_cleanly(tmp_path, sig):
    proc = subprocess.Popen(_command(tmp_path, "--steps", "100000", "--save-every", "1000"), cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "log.jsonl").is_file() or len(_step_losses(tmp_path)) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    (step, path), = list_checkpoints(tmp_path)  # no periodic one yet: the checkpoint the signal wrote
    assert f"stopped by {sig.name} after step {step}; saved {path}" in out + err
    assert "--resume" in out + err
    assert max(_step_losses(tmp_path)) == step == read_checkpoint(path)["step"]


@pytest.fixture
def short_run(tmp_path) -> Path:
    """8 steps in-process, a checkpoint every 4: checkpoint-0000004.pt and checkpoint-0000008.pt."""
    run(parse_args([*COMMON, "--steps", "8", "--save-every", "4", "--out", str(tmp_path)]))
    return tmp_path


def _resume(out: Path, *extra: str) -> dict:
    return run(parse_args([*COMMON, "--out", str(out), "--resume", *extra]))


@pytest.mark.parametrize("damage", ["truncated", "garbage", "one flipped bit"])
def test_an_unreadable_checkpoint_is_reported_and_skipped(short_run, tmp_path_factory, damage, capsys):
    newest = checkpoint_path(short_run, 8)
    data = bytearray(newest.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    else:  # the middle of the file is inside a tensor's bytes: torch.load alone would not notice
        data[len(data) // 2] ^= 1
    newest.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="not a readable checkpoint \\(truncated or corrupt\\)") as err:
        read_checkpoint(newest)
    assert "weights_only" not in str(err.value)  # torch.load's advice is wrong for a damaged file
    capsys.readouterr()
    _resume(short_run, "--steps", "12")
    said = capsys.readouterr().out
    assert f"skipping an unreadable checkpoint: {newest}" in said
    assert f"resuming from {checkpoint_path(short_run, 4)} (step 4)" in said
    straight = tmp_path_factory.mktemp("straight")
    run(parse_args([*COMMON, "--steps", "12", "--out", str(straight)]))
    assert all(torch.equal(a, b) for a, b in zip(_weights(straight, 12).values(), _weights(short_run, 12).values()))


@pytest.mark.parametrize(("flag", "value", "stored"), [
    ("--preset", "small", "tiny"), ("--context", "16", "32"), ("--batch-size", "4", "8"), ("--lr", "0.001", "0.003"),
    ("--warmup", "5", "20"), ("--seed", "4", "3"), ("--precision", "bf16", "fp32"), ("--dropout", "0.2", "0.0"),
])
def test_a_resume_that_changes_the_run_is_refused(short_run, flag, value, stored):
    args = parse_args([*COMMON, "--out", str(short_run), "--resume", "--steps", "12", flag, value])
    with pytest.raises(ValueError, match=f"trained with {flag} {stored}, this command gives {flag} {value}"):
        run(args)
    assert max(step for step, _ in list_checkpoints(short_run)) == 8  # nothing written


def test_resume_refuses_fewer_steps_and_allows_a_declared_change(short_run, capsys):
    before = checkpoint_path(short_run, 8).read_bytes()
    with pytest.raises(ValueError, match="--steps 6 is below the 8 steps checkpoint-0000008.pt has done"):
        _resume(short_run, "--steps", "6")
    _resume(short_run, "--steps", "8")
    assert "already at step 8 of 8: nothing to do" in capsys.readouterr().out
    assert checkpoint_path(short_run, 8).read_bytes() == before  # not rewritten
    _resume(short_run, "--steps", "9", "--lr", "0.001", "--allow-change", "lr")
    records = [json.loads(line) for line in (short_run / "log.jsonl").read_text().splitlines()]
    lr = {r["step"]: r["lr"] for r in records if "lr" in r and "loss" in r}
    assert lr[9] == pytest.approx(lr[8] * 9 / 8 / 3)  # warm-up is linear; the peak is now a third
    with pytest.raises(ValueError, match="trained with --batch-size 8, this command gives --batch-size 4"):
        _resume(short_run, "--steps", "10", "--batch-size", "4", "--allow-change", "lr")
    _resume(short_run, "--steps", "10", "--batch-size", "4", "--lr", "0.001", "--allow-change", "batch-size",
            "--allow-change", "lr")


def test_a_fresh_run_does_not_overwrite_one(short_run):
    with pytest.raises(ValueError, match="already holds a run \\(checkpoint-0000008.pt\\): pass --resume"):
        run(parse_args([*COMMON, "--steps", "8", "--out", str(short_run)]))


@pytest.mark.parametrize("bad", [
    ["--steps", "-1"], ["--steps", "0"], ["--steps", "x"], ["--lr", "-1"], ["--lr", "nan"], ["--lr", "inf"],
    ["--batch-size", "0"], ["--context", "0"], ["--warmup", "0"], ["--save-every", "0"], ["--keep", "0"],
    ["--eval-every", "0"], ["--log-every", "0"], ["--seed", "-1"], ["--device", "tpu"], ["--preset", "bert-tiny"],
    ["--precision", "fp64"], ["--allow-change", "preset"], ["--dropout", "1"], ["--dropout", "-0.1"],
])
def test_bad_arguments_are_one_line_errors(bad, capsys):
    argv = ["--steps", "1", "--out", "x", "--resume", *bad]
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m companion.train: error: argument " + bad[0]), err


def test_more_refusals(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--steps", "1", "--out", "x", "--allow-change", "lr"])
    assert "--allow-change applies to a resumed run: add --resume" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file: give a folder"):
        run(parse_args([*COMMON, "--steps", "1", "--out", str(tmp_path / "file")]))


def test_a_diverging_run_names_the_newest_checkpoint(tmp_path):
    result = _launch(tmp_path, "--steps", "200", "--save-every", "1", "--lr", "1e6")
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("python -m companion.train: error: loss became nan at step ")
    assert f"the newest checkpoint is {list_checkpoints(tmp_path)[-1][1]}" in line


def test_deterministic_kernels_change_nothing_on_the_cpu(tmp_path):
    plain = run(parse_args([*COMMON, "--steps", "3", "--out", str(tmp_path / "a")]))
    try:
        strict = run(parse_args([*COMMON, "--steps", "3", "--out", str(tmp_path / "b"), "--deterministic"]))
    finally:
        torch.use_deterministic_algorithms(False)
    assert strict["train_loss"] == plain["train_loss"]


def test_refusals_from_the_command_line(tmp_path):
    result = _launch(tmp_path, "--steps", "1", "--resume")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"python -m companion.train: error: no checkpoint-*.pt in {tmp_path}"]
    result = _launch(tmp_path, "--steps", "2", "--batch-size", "7", processes=2)
    assert result.returncode != 0
    assert "--batch-size 7 must be divisible by the number of processes 2" in result.stderr
    with pytest.raises(ValueError, match="--precision fp16 needs a CUDA device"):
        run(parse_args([*COMMON, "--steps", "1", "--out", str(tmp_path), "--precision", "fp16"]))


def test_the_log_line_the_json_log_and_a_compiled_model(tmp_path, capsys):
    eager = run(parse_args([*COMMON, "--steps", "4", "--out", str(tmp_path), "--log-every", "2", "--eval-every", "3"]))
    printed = capsys.readouterr().out.splitlines()
    lines = [line for line in printed if line.startswith("step ") and "tokens/s" in line]
    assert [line.split()[1] for line in lines] == ["2/4", "4/4"]
    assert all(" tokens/s" in line and "ETA" in line and "MFU" not in line for line in lines)  # no MFU on a CPU
    assert [line.split()[1] for line in printed if line.startswith("step ") and "validation" in line] == ["3/4", "4/4"]
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert records[0]["event"] == "start" and records[0]["preset"] == "tiny"
    assert [r["step"] for r in records if "tokens_per_s" in r] == [2, 4]  # the printed lines' measurements
    assert [r["checkpoint"] for r in records if "checkpoint" in r] == ["checkpoint-0000004.pt"]
    assert [r["loss"] for r in records if "loss" in r] == eager["train_loss"]
    assert [[r["step"], r["eval_loss"]] for r in records if "eval_loss" in r] == eager["eval_loss"]
    assert json.loads((tmp_path / "history.json").read_text())["train_loss"] == eager["train_loss"]
    compiled = run(parse_args([*COMMON, "--steps", "4", "--out", str(tmp_path / "c"), "--compile"]))
    assert compiled["train_loss"] == pytest.approx(eager["train_loss"], abs=1e-4)
    state = _weights(tmp_path / "c", 4)
    assert not any(k.startswith("_orig_mod") for k in state)  # compiled in place: the same keys


def test_the_log_lines_mfu_counts_every_gpu(monkeypatch, capsys):
    import companion.training.run_log as run_log
    from companion.config import ModelConfig
    from companion.flops import flops_per_token
    from companion.models.gpt import GPT

    monkeypatch.setattr(run_log, "peak_flops", lambda device: 1e9)  # a (slow) GPU of 1 GFLOP/s
    args = parse_args(["--steps", "2", "--batch-size", "8", "--context", "32", "--out", "x", "--log-every", "1",
                       "--precision", "bf16"])
    gpt = GPT(ModelConfig.preset("tiny", vocab_size=50, max_len=32))
    lines = []
    for world in (1, 2):
        log = run_log.StepLog(gpt, args, torch.device("cpu"), start_step=0, world=world)
        log.last -= 1.0  # one second since the last line
        log(0, type("History", (), {"train_loss": [1.0], "lr": [1e-3]})())
        lines.append(capsys.readouterr().out)
    per_token = flops_per_token(sum(p.numel() for p in gpt.parameters()), 2, 32, 64)
    for world, line in zip((1, 2), lines):  # 256 tokens in about a second, over world x 1 GFLOP/s
        shown = float(line.split("MFU ")[1].split("%")[0]) / 100
        assert shown == pytest.approx(256 * per_token / (world * 1e9), rel=0.05), line
    fp32 = run_log.StepLog(gpt, parse_args(["--steps", "1", "--out", "x"]), torch.device("cpu"), start_step=0)
    assert fp32.peak is None  # no MFU against a 16-bit peak for a float32 run
