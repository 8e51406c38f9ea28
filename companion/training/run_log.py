"""What a training run tells a person while it goes: a line every N steps, and a JSON-lines file.

:class:`StepLog` prints the step, loss, learning rate, tokens/s, elapsed time, an estimate of the
time left and, on a GPU whose peak :mod:`companion.flops` knows, the model FLOPs utilisation.
:class:`JsonLog` writes the same facts, one JSON object per line, flushed as they come, so that a
crash keeps everything up to its last step.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from companion.flops import flops_per_token, mfu, peak_flops
from companion.models.gpt import GPT
from companion.utils import count_parameters, progress_write

__all__ = ["StepLog", "JsonLog"]


class StepLog:
    """The periodic log line of rank 0: step, loss, learning rate, tokens/s, MFU on a known GPU, elapsed, ETA.

    Tokens/s counts every process's tokens (the global batch) over the wall time since the last
    line, so the first line includes compilation and warm-up. MFU (:mod:`companion.flops`) is
    against the dense bf16 peak of all ``world`` GPUs together (W times one GPU's), and shown for
    16-bit runs only: an fp32 run cannot use that peak.
    """

    def __init__(self, gpt: GPT, args: argparse.Namespace, device: torch.device, start_step: int,
                 world: int = 1) -> None:
        c = gpt.config
        self.every, self.steps, self.tokens = args.log_every, args.steps, args.batch_size * args.context
        self.flops = flops_per_token(count_parameters(gpt), c.n_layers, args.context, c.d_model)
        peak = peak_flops(device) if args.precision != "fp32" else None  # the peaks are 16-bit ones
        self.peak = peak * world if peak else None
        self.start = self.last = time.perf_counter()
        self.start_step = self.last_step = start_step

    def elapsed(self) -> float:
        """Seconds since this process started training."""
        return time.perf_counter() - self.start

    def __call__(self, step: int, history) -> dict | None:
        """Print the line if step ``step`` (0-based) is due one; return its measurements (else ``None``)."""
        done = step + 1
        if done % self.every and done != self.steps:
            return None
        now = time.perf_counter()
        rate = (done - self.last_step) * self.tokens / (now - self.last)
        elapsed = now - self.start
        eta = elapsed / (done - self.start_step) * (self.steps - done)
        utilisation = mfu(rate, self.flops, self.peak) if self.peak else None
        util = f"  MFU {utilisation:.1%}" if utilisation is not None else ""
        progress_write(f"step {done}/{self.steps}  loss {history.train_loss[-1]:.4f}  lr {history.lr[-1]:.2e}  "
                       f"{rate:,.0f} tokens/s{util}  elapsed {elapsed:.0f} s  ETA {eta:.0f} s")
        self.last, self.last_step = now, done
        return {"tokens_per_s": round(rate, 1), "mfu": utilisation, "eta_s": round(eta, 1)}


class JsonLog:
    """``OUT/log.jsonl``: one JSON object per line, flushed as it is written, so a crash keeps it.

    Resuming from step ``k`` first drops the lines about steps after ``k`` (steps the crashed run
    did but did not save, which the resumed run does again), so the file reads as one run.
    """

    def __init__(self, path: Path, resume_step: int | None) -> None:
        kept = []
        if resume_step is not None and path.is_file():
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # the line a crash cut short
                    continue
                if record.get("step", 0) <= resume_step:
                    kept.append(line + "\n")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
        self.file = open(path, "a")  # closed by close()

    def write(self, **record) -> None:
        """Append ``record`` as one line of JSON and flush it to the file."""
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        """Close the file (every line is already written)."""
        self.file.close()
