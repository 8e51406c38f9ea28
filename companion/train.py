"""Train a GPT on Shakespeare from the command line — on one process, or several with torchrun.

::

    python -m companion.train --preset tiny --steps 200 --batch-size 32 --seed 0 --out runs/tiny
    python -m companion.train --preset tiny --steps 400 --batch-size 32 --seed 0 --out runs/tiny --resume
    torchrun --standalone --nproc_per_node=2 -m companion.train --preset tiny --steps 200 \\
        --batch-size 32 --seed 0 --out runs/tiny-ddp
    python -m companion.train --preset small --steps 2000 --batch-size 64 --context 256 --device cuda \\
        --precision bf16 --compile --out runs/small-gpu

The model is a character-level :class:`~companion.models.gpt.GPT` built from
``ModelConfig.preset(--preset)``; the corpus is the training split of the plays
(:mod:`companion.data`).

**A run survives a crash.** Every ``--save-every`` steps, and after the last, rank 0 writes
``OUT/checkpoint-0000200.pt`` (model, optimizer, step, the random states of every process:
:mod:`companion.training.checkpoint`) atomically, and keeps the newest ``--keep``. SIGTERM or
Ctrl-C (SIGINT) lets the step finish, saves, and exits with status 128 + the signal's number,
saying how to resume; the same signal twice stops at once. ``--resume`` continues from the newest
checkpoint that reads (a damaged file is reported and skipped) up to ``--steps`` in total, and
ends with the weights an uninterrupted run would have, bit for bit, even after ``kill -9``: the
batch of step ``s`` is drawn from a generator seeded with ``(--seed, s)``, so the data order needs
no state, and the learning rate is a function of the step. That is tested on the CPU, whose
kernels are deterministic; on a GPU some kernels (an embedding's backward, for one) add in a
varying order, so two runs agree to rounding unless ``--deterministic`` selects deterministic
kernels (not measured here). Only rank 0 reads and writes ``OUT``; it hands a checkpoint to the
other processes, so several machines need not share a folder. A resume that would change the
model, the data or the optimizer (another ``--preset``, ``--context``, ``--batch-size``, ``--lr``,
…) is refused, naming the setting and both values; ``--allow-change`` accepts the legitimate ones.

**The log.** Every ``--log-every`` steps rank 0 prints the loss, the learning rate, tokens/s,
elapsed time, an estimate of the time left and, on a GPU whose peak :mod:`companion.flops` knows,
the model FLOPs utilisation (MFU); every ``--eval-every`` steps the validation loss.
``OUT/log.jsonl`` holds the same as JSON lines, written as the run goes (one line per step and per
evaluation), and ``OUT/history.json`` the losses at the end. ``--compile`` compiles the model
with ``torch.compile``.

**Several processes** (PyTorch's own engine, Li et al., 2020): launched by ``torchrun``, each
process joins a process group (``gloo`` on CPU, ``nccl`` on CUDA, one GPU per process), wraps the
model in ``DistributedDataParallel`` — which averages the gradients of all processes during the
backward pass — and takes ``B / W`` rows of every global batch of ``--batch-size B`` rows. Every
process draws the same global batch, so W processes compute the gradient of the same B rows as one
process does, and end with the same weights (to rounding). On several machines, run the same
command on each with ``--nnodes=N --node_rank=i --rdzv_endpoint=HOST:PORT`` instead of
``--standalone``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from companion.config import ModelConfig
from companion.data import CharVocab, shakespeare_text
from companion.models.gpt import GPT
from companion.training import PRECISIONS, adamw, evaluate, train
from companion.training.checkpoint import (
    checkpoint_path,
    list_checkpoints,
    prune_checkpoints,
    read_latest_checkpoint,
    restore_checkpoint,
    rng_states,
    save_checkpoint,
    set_rng_states,
)
from companion.training.distributed import (
    any_process,
    every_process,
    from_rank_0,
    full_states,
    load_full_states,
    setup,
)
from companion.training.interruption import StopOnSignal, Stopped
from companion.training.losses import cross_entropy_loss
from companion.training.run_log import JsonLog, StepLog
from companion.training.schedules import noam
from companion.utils import count_parameters, progress_write

__all__ = ["GPT_PRESETS", "parse_args", "run", "main"]

GPT_PRESETS = ("tiny", "small", "llama-tiny", "gpt2-small")
# Stored in every checkpoint and compared on --resume: what the weights, the data and the optimizer depend on.
RUN_SETTINGS = ("preset", "context", "dropout", "batch_size", "lr", "warmup", "seed", "precision")
# Those a resumed run may change with --allow-change (the rest fix the model or the data's identity).
CHANGEABLE = ("lr", "warmup", "batch-size", "precision")


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _positive_float(text: str) -> float:
    value = _float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def _probability(text: str) -> float:
    value = _float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _seed(text: str) -> int:
    value = _at_least(0)(text)
    if value >= 2**31:
        raise argparse.ArgumentTypeError(f"must be below 2**31, got {value}")
    return value


def _device(text: str) -> str:
    try:
        kind = torch.device(text).type
    except (RuntimeError, ValueError):
        kind = None
    if kind not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N or mps, got {text!r}")
    return text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage block (``--help`` has it)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of ``python -m companion.train``; a bad value exits with status 2 and one line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _Parser(prog="python -m companion.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=GPT_PRESETS, help="model size (ModelConfig.preset)")
    parser.add_argument("--steps", type=_at_least(1), required=True, help="optimizer steps in total")
    parser.add_argument("--batch-size", type=_at_least(1), default=32,
                        help="global batch: rows per step, all processes")
    parser.add_argument("--context", type=_at_least(1), default=64, help="characters per row")
    parser.add_argument("--dropout", type=_probability, default=0.0, help="dropout probability of the model")
    parser.add_argument("--lr", type=_positive_float, default=3e-3, help="peak learning rate (after --warmup steps)")
    parser.add_argument("--warmup", type=_at_least(1), default=20, help="warm-up steps, then 1/sqrt(step) decay")
    parser.add_argument("--seed", type=_seed, default=0, help="seeds the model's initialisation and the data order")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS, help="bf16: autocast on CPU or CUDA")
    parser.add_argument("--out", type=Path, required=True, help="folder for the checkpoints and the logs")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in OUT")
    parser.add_argument("--allow-change", action="append", default=[], choices=CHANGEABLE, metavar="SETTING",
                        help=f"with --resume, accept a new value of this setting ({', '.join(CHANGEABLE)}; "
                             "repeatable): the run goes on, but is no longer the run an uninterrupted one would be")
    parser.add_argument("--save-every", type=_at_least(1), default=100,
                        help="write a checkpoint every N steps (and after the last)")
    parser.add_argument("--keep", type=_at_least(1), default=3, help="keep the newest K checkpoints")
    parser.add_argument("--eval-every", type=_at_least(1), default=100,
                        help="compute the validation loss every N steps (and after the last)")
    parser.add_argument("--log-every", type=_at_least(1), default=50,
                        help="print a line every N steps: loss, learning rate, tokens/s and, on a known GPU, MFU")
    parser.add_argument("--device", type=_device, default=None, help="cpu, cuda or mps (default: cuda if available)")
    parser.add_argument("--deterministic", action="store_true",
                        help="use only deterministic kernels (torch.use_deterministic_algorithms), so that runs on "
                             "a GPU repeat bit for bit; slower there, no change on the CPU")
    parser.add_argument("--compile", action="store_true",
                        help="compile the model with torch.compile (the first steps wait for the compiler)")
    parser.add_argument("--fsdp", action="store_true",
                        help="shard weights, gradients and optimizer state over the processes (FSDP2 fully_shard) "
                             "instead of replicating them (DDP)")
    args = parser.parse_args(argv)
    if args.allow_change and not args.resume:
        parser.error("--allow-change applies to a resumed run: add --resume")
    args.argv = argv
    return args


def _check_resumable(state: dict, path: Path, args: argparse.Namespace, vocab: str, sharded: bool) -> None:
    """Refuse a resume that would silently change the run stored in ``state``."""
    stored = state["extra"]
    if "settings" not in stored:
        raise ValueError(f"--resume: {path} was not written by python -m companion.train")
    if args.steps < state["step"]:
        raise ValueError(f"--steps {args.steps} is below the {state['step']} steps {path.name} has done "
                         "(--steps is the total; give at least that many)")
    for name in RUN_SETTINGS:
        then, now = stored["settings"].get(name), getattr(args, name)
        flag = "--" + name.replace("_", "-")
        if then != now and flag[2:] not in args.allow_change:
            hint = f", or pass --allow-change {flag[2:]}" if flag[2:] in CHANGEABLE else ""
            raise ValueError(f"--resume: {path.name} was trained with {flag} {then}, this command gives {flag} {now}; "
                             f"give {flag} {then}{hint}")
    if stored["vocab"] != vocab:
        raise ValueError(f"--resume: {path.name} was trained on another character set than the corpus installed here")
    if stored["fsdp"] != sharded:
        how = "with --fsdp on several processes" if stored["fsdp"] else "without --fsdp (or on one process)"
        raise ValueError(f"--resume: {path.name} was written by a {'sharded' if stored['fsdp'] else 'replicated'} "
                         f"run: resume it {how}")


def _resume_hint(args: argparse.Namespace, world: int) -> str:
    argv = args.argv + ([] if "--resume" in args.argv else ["--resume"])
    command = "python -m companion.train " + shlex.join(argv)
    return command if world == 1 else f"the same torchrun command with --resume ({shlex.join(argv)})"


def run(args: argparse.Namespace) -> dict:
    """Train as ``args`` say; return (on every rank) the run's summary: losses, world size, and
    ``stopped_by``, the signal's name if one stopped the run before ``--steps`` (else ``None``)."""
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file: give a folder")
    if args.deterministic:  # before any CUDA work: cuBLAS reads this when it starts
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    rank, world, device = setup(args.device)
    try:
        if args.precision == "fp16" and device.type != "cuda":
            raise ValueError(f"--precision fp16 needs a CUDA device (fp16 training needs a gradient scaler), "
                             f"this run is on {device.type}: use --precision bf16 or fp32")
        if args.batch_size % world:
            raise ValueError(f"--batch-size {args.batch_size} must be divisible by the number of processes {world} "
                             "(each process takes an equal share of every batch)")
        sharded = args.fsdp and world > 1

        def find_run() -> tuple[dict | None, Path | None, list[str]]:
            if args.resume:
                return read_latest_checkpoint(args.out)
            if list_checkpoints(args.out):
                newest = list_checkpoints(args.out)[-1][1]
                raise ValueError(f"--out {args.out} already holds a run ({newest.name}): pass --resume to continue "
                                 "it, or choose another --out")
            return None, None, []

        # Rank 0 reads the checkpoint and hands it to the others: only rank 0 touches OUT.
        state, path, skipped = from_rank_0(find_run, world)
        if rank == 0:
            for reason in skipped:
                progress_write(f"skipping an unreadable checkpoint: {reason}")
        torch.manual_seed(args.seed)  # the model's initialisation
        vocab = CharVocab.from_text(shakespeare_text("all"))  # every character of the plays has an id
        chars = "".join(vocab.itos)
        if state is not None:
            _check_resumable(state, path, args, chars, sharded)
            if rank == 0:
                progress_write(f"resuming from {path} (step {state['step']})")
                if state["extra"].get("device_type", device.type) != device.type:
                    progress_write(f"note: the checkpoint was written on {state['extra']['device_type']}, this run is "
                                   f"on {device.type}: it goes on, equal to an uninterrupted run to rounding only")
        ids = vocab.encode(shakespeare_text("train"))
        config = ModelConfig.preset(args.preset, vocab_size=len(vocab), max_len=args.context, dropout=args.dropout)
        model = gpt = GPT(config).to(device)
        optimizer = adamw(model, lr=args.lr)
        scaler = torch.amp.GradScaler("cuda") if args.precision == "fp16" else None
        done, history = 0, {"train_loss": [], "eval_loss": []}
        if state is not None:
            done, history = state["step"], state["extra"]["history"]
            if not sharded:  # sharded states are loaded after fully_shard, below
                restore_checkpoint(state, model=model, optimizer=optimizer, restore_rng=False)
        if sharded:
            from torch.distributed.fsdp import fully_shard

            for block in model.layers:  # each block's weights gathered just in time, then freed
                fully_shard(block)
            fully_shard(model)
            optimizer = adamw(model, lr=args.lr)  # over the sharded parameters
            if state is not None:
                for group in optimizer.param_groups:  # train() adds it; the loaded groups have it
                    group["initial_lr"] = group["lr"]
                load_full_states(model, optimizer, state)
        elif world > 1:
            model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        if state is not None:
            if "lr" in args.allow_change:  # the loaded optimizer holds the old rate; the schedule scales initial_lr
                for group in optimizer.param_groups:
                    group["initial_lr"] = group["lr"] = args.lr
            if scaler is not None and state["extra"].get("scaler"):  # fp16: the loss scale and its growth count
                scaler.load_state_dict(state["extra"]["scaler"])
            per_rank = state["extra"]["rng"]
            set_rng_states(per_rank[rank] if len(per_rank) == world else state["rng"])
            if len(per_rank) != world and rank == 0:
                progress_write(f"note: {len(per_rank)} process(es) wrote the checkpoint, {world} resume it: "
                               "the run continues, equal to an uninterrupted one to rounding, not bit for bit")
        if args.compile:  # in place, so that state_dict() keeps its keys; after DDP/FSDP wrapping
            gpt.compile()
        share = args.batch_size // world

        def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            # The batch of a step depends on (seed, step) alone: a resumed run needs no data state.
            # Every process draws the same global batch, then keeps its own rows.
            data = torch.Generator().manual_seed((args.seed << 32) + step)
            starts = torch.randint(0, len(ids) - args.context - 1, (args.batch_size,), generator=data)
            mine = starts[rank * share : (rank + 1) * share]
            rows = torch.stack([ids[s : s + args.context + 1] for s in mine.tolist()])
            return rows[:, :-1], rows[:, 1:]

        eval_gen = torch.Generator().manual_seed(10_000 + args.seed)
        val_ids = vocab.encode(shakespeare_text("validation"))
        starts = torch.randint(0, len(val_ids) - args.context - 1, (4 * 16,), generator=eval_gen)
        rows = torch.stack([val_ids[s : s + args.context + 1] for s in starts.tolist()])
        eval_batches = [(r[:, :-1], r[:, 1:]) for r in rows.split(16)]
        settings = {name: getattr(args, name) for name in RUN_SETTINGS}

        def save(step: int) -> None:
            model_state, optimizer_state = full_states(model, optimizer, sharded)  # every process takes part
            rngs = every_process(rng_states(), world)
            if rank == 0:
                path = save_checkpoint(
                    checkpoint_path(args.out, step), model=model_state, optimizer=optimizer_state, step=step,
                    extra={"history": history, "settings": settings, "vocab": chars, "fsdp": sharded, "rng": rngs,
                           "device_type": device.type, "scaler": scaler.state_dict() if scaler is not None else None})
                prune_checkpoints(args.out, args.keep)
                jsonl.write(step=step, checkpoint=path.name)
            if world > 1:
                dist.barrier()

        stopped_by = None
        if args.steps > done:
            args.out.mkdir(parents=True, exist_ok=True)
            log = StepLog(gpt, args, device, start_step=done, world=world) if rank == 0 else None
            jsonl = JsonLog(args.out / "log.jsonl", done if state is not None else None) if rank == 0 else None
            if rank == 0:
                jsonl.write(step=done, event="resume" if state is not None else "start", world_size=world,
                            device=str(device), **settings)
                progress_write(f"{args.preset}: {count_parameters(gpt):,} parameters, {world} process(es) on "
                               f"{device.type}; steps {done + 1}-{args.steps}, a checkpoint every "
                               f"{args.save_every} steps in {args.out}")

            def on_step(step: int, hist) -> None:
                now = step + 1
                history["train_loss"].append(hist.train_loss[-1])
                if rank == 0:
                    jsonl.write(step=now, loss=hist.train_loss[-1], lr=hist.lr[-1], grad_norm=hist.grad_norm[-1],
                                elapsed_s=round(log.elapsed(), 3))
                    line = log(step, hist)
                    if line is not None:  # the printed line's measurements
                        jsonl.write(step=now, **line)
                if now % args.eval_every == 0 or now == args.steps:
                    loss = evaluate(model, eval_batches, device=device)  # every process: FSDP gathers weights
                    history["eval_loss"].append([now, loss])
                    if rank == 0:
                        jsonl.write(step=now, eval_loss=loss)
                        progress_write(f"step {now}/{args.steps}  validation loss {loss:.4f}")
                stop = any_process(stopper.received is not None, world, device)
                if stop or now % args.save_every == 0 or now == args.steps:
                    save(now)
                if stop and now < args.steps:
                    raise Stopped(now)

            # Noam-shaped (Vaswani et al., 2017): a function of the step alone, so a resumed run
            # continues exactly as an uninterrupted one.
            rate = noam(config.d_model, args.warmup)
            peak = rate(args.warmup)
            try:
                with StopOnSignal(verbose=rank == 0) as stopper:
                    train(model, batch, args.steps - done, loss_fn=cross_entropy_loss, optimizer=optimizer,
                          lr_schedule=lambda step: rate(step + 1) / peak, start_step=done,
                          precision=args.precision, device=device, progress=rank == 0 and sys.stderr.isatty(),
                          desc=f"rank {rank}", on_step=on_step, scaler=scaler)
            except Stopped as stop:
                stopped_by = signal.Signals(stopper.received).name
                if rank == 0:
                    jsonl.write(step=stop.args[0], event="stop", signal=stopped_by)
                    progress_write(f"stopped by {stopped_by} after step {stop.args[0]}; saved "
                                   f"{checkpoint_path(args.out, stop.args[0])}. Resume with:\n  "
                                   f"{_resume_hint(args, world)}")
            finally:
                if rank == 0:
                    jsonl.close()
        elif rank == 0:
            progress_write(f"{args.out} is already at step {done} of {args.steps}: nothing to do")
        summary = {"world_size": world, "steps": len(history["train_loss"]), "stopped_by": stopped_by, **history}
        if rank == 0:
            (args.out / "history.json").write_text(json.dumps(summary))
            if stopped_by is None and args.steps > done:
                print(f"{args.steps} steps on {world} process(es): train loss {history['train_loss'][-1]:.4f}, "
                      f"validation loss {history['eval_loss'][-1][1]:.4f} -> "
                      f"{checkpoint_path(args.out, args.steps)}")
        return summary
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m companion.train``: 0 when done, 128 + the signal's number when a
    signal stopped the run (after saving), 2 with one line on stderr for a refused setting, 1 for a
    loss that diverged."""
    args = parse_args(argv)
    first = os.environ.get("RANK", "0") == "0"
    try:
        summary = run(args)
    except (ValueError, FileNotFoundError) as err:
        if first:
            print(f"python -m companion.train: error: {err}", file=sys.stderr)
        return 2
    except FloatingPointError as err:  # the loss diverged
        if first:
            saved = list_checkpoints(args.out)
            where = f"the newest checkpoint is {saved[-1][1]}" if saved else "no checkpoint was written"
            print(f"python -m companion.train: error: {err}; {where} (a lower --lr, with --resume "
                  "--allow-change lr, may get past it)", file=sys.stderr)
        return 1
    if summary["stopped_by"]:
        return 128 + signal.Signals[summary["stopped_by"]].value
    return 0


if __name__ == "__main__":
    sys.exit(main())
