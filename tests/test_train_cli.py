"""``python -m companion.train``: resuming is exact, and 2 processes (DDP or FSDP) equal 1 process.

These tests launch real processes: ``torchrun --standalone --nproc_per_node=2`` with the gloo
backend on the CPU, as a reader without GPUs would. Each run is a few optimizer steps of the
``tiny`` preset.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from companion.train import parse_args, run

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--preset", "tiny", "--batch-size", "8", "--context", "32", "--seed", "3", "--device", "cpu"]


def _launch(out: Path, *extra: str, processes: int = 1) -> subprocess.CompletedProcess:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
                if processes > 1 else [sys.executable])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([*launcher, "-m", "companion.train", *COMMON, "--out", str(out), *extra], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "checkpoint.pt", weights_only=True)["model"]


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("single")
    result = _launch(out, "--steps", "6")
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_give_the_weights_of_one(single, tmp_path, mode):
    result = _launch(tmp_path, "--steps", "6", *(["--fsdp"] if mode == "fsdp" else []), processes=2)
    assert result.returncode == 0, result.stderr
    assert "6 steps on 2 process(es)" in result.stdout
    one, two = _weights(single), _weights(tmp_path)
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], atol=1e-5, rtol=1e-5, msg=name)


def test_resuming_continues_exactly(single, tmp_path):
    for steps, resume in (("3", []), ("6", ["--resume"])):
        result = _launch(tmp_path, "--steps", steps, *resume)
        assert result.returncode == 0, result.stderr
    straight, resumed = _weights(single), _weights(tmp_path)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_batch_not_divisible_by_the_processes_is_refused(tmp_path):
    result = _launch(tmp_path, "--steps", "1", "--batch-size", "7", processes=2)
    assert result.returncode != 0
    assert "--batch-size 7 must be divisible by the number of processes 2" in result.stderr


def test_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="--resume: no checkpoint at"):
        run(parse_args([*COMMON, "--steps", "1", "--out", str(tmp_path), "--resume"]))
    with pytest.raises(ValueError, match="precision='fp16' needs a CUDA device"):
        run(parse_args([*COMMON, "--steps", "1", "--out", str(tmp_path), "--precision", "fp16"]))
    with pytest.raises(ValueError, match="--steps must be >= 1"):
        run(parse_args([*COMMON, "--steps", "0", "--out", str(tmp_path)]))
    with pytest.raises(SystemExit):
        parse_args(["--steps", "1", "--out", str(tmp_path), "--precision", "fp64"])


def test_the_log_line_and_a_compiled_model(tmp_path, capsys):
    args = parse_args([*COMMON, "--steps", "4", "--out", str(tmp_path), "--log-every", "2"])
    eager = run(args)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["2/4", "4/4"]
    assert all(" tokens/s" in line and "ETA" in line and "MFU" not in line for line in lines)  # no MFU on a CPU
    compiled = run(parse_args([*COMMON, "--steps", "4", "--out", str(tmp_path / "c"), "--compile"]))
    assert compiled["train_loss"] == pytest.approx(eager["train_loss"], abs=1e-4)
    state = torch.load(tmp_path / "c" / "checkpoint.pt", weights_only=True)["model"]
    assert not any(k.startswith("_orig_mod") for k in state)  # compiled in place: the same keys
    with pytest.raises(ValueError, match="--log-every must be >= 1"):
        run(parse_args([*COMMON, "--steps", "1", "--out", str(tmp_path), "--log-every", "0"]))


def test_the_log_lines_mfu_counts_every_gpu(monkeypatch, capsys):
    import companion.train as cli
    from companion.config import ModelConfig
    from companion.flops import flops_per_token
    from companion.models.gpt import GPT

    monkeypatch.setattr(cli, "peak_flops", lambda device: 1e9)  # a (slow) GPU of 1 GFLOP/s
    args = parse_args(["--steps", "2", "--batch-size", "8", "--context", "32", "--out", "x", "--log-every", "1",
                       "--precision", "bf16"])
    gpt = GPT(ModelConfig.preset("tiny", vocab_size=50, max_len=32))
    lines = []
    for world in (1, 2):
        log = cli.StepLog(gpt, args, torch.device("cpu"), start_step=0, world=world)
        log.last -= 1.0  # one second since the last line
        log(0, type("History", (), {"train_loss": [1.0], "lr": [1e-3]})())
        lines.append(capsys.readouterr().out)
    per_token = flops_per_token(sum(p.numel() for p in gpt.parameters()), 2, 32, 64)
    for world, line in zip((1, 2), lines):  # 256 tokens in about a second, over world x 1 GFLOP/s
        shown = float(line.split("MFU ")[1].split("%")[0]) / 100
        assert shown == pytest.approx(256 * per_token / (world * 1e9), rel=0.05), line
    fp32 = cli.StepLog(gpt, parse_args(["--steps", "1", "--out", "x"]), torch.device("cpu"), start_step=0)
    assert fp32.peak is None  # no MFU against a 16-bit peak for a float32 run
