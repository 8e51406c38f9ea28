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
(:mod:`companion.data`). Rank 0 writes ``OUT/checkpoint.pt`` (model, optimizer, step, every random
state: :mod:`companion.training.checkpoint`) and ``OUT/history.json`` (losses per step).
``--resume`` continues from the checkpoint up to ``--steps`` in total, bit for bit as if the run
had never stopped. Every ``--log-every`` steps rank 0 prints the loss, the learning rate, tokens/s
and, on a GPU whose peak :mod:`companion.flops` knows, the model FLOPs utilisation (MFU);
``--compile`` compiles the model with ``torch.compile``.

**Several processes** (PyTorch's own engine, Li et al., 2020): launched by ``torchrun``, each
process joins a process group (``gloo`` on CPU, ``nccl`` on CUDA, one GPU per process), wraps the
model in ``DistributedDataParallel`` — which averages the gradients of all processes during the
backward pass — and takes ``B / W`` rows of every global batch of ``--batch-size B`` rows. Every
process draws the same global batch from the same seeded generator, so W processes compute the
gradient of the same B rows as one process does, and end with the same weights (to rounding). On
several machines, run the same command on each with ``--nnodes=N --node_rank=i
--rdzv_endpoint=HOST:PORT`` instead of ``--standalone``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from companion.config import PRESETS, ModelConfig
from companion.data import CharVocab, shakespeare_text
from companion.flops import flops_per_token, mfu, peak_flops
from companion.models.gpt import GPT
from companion.training import PRECISIONS, adamw, evaluate, load_checkpoint, save_checkpoint, train
from companion.training.losses import cross_entropy_loss
from companion.training.schedules import noam
from companion.utils import count_parameters, progress_write, seed_everything

__all__ = ["parse_args", "run", "main"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of ``python -m companion.train``."""
    parser = argparse.ArgumentParser(prog="python -m companion.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model size (ModelConfig.preset)")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps in total")
    parser.add_argument("--batch-size", type=int, default=32, help="global batch: rows per step, all processes")
    parser.add_argument("--context", type=int, default=64, help="characters per row")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (after --warmup steps)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up steps, then 1/sqrt(step) decay")
    parser.add_argument("--seed", type=int, default=0, help="seeds the model's initialisation and the data order")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS, help="bf16: autocast on CPU or CUDA")
    parser.add_argument("--out", type=Path, required=True, help="folder for checkpoint.pt and history.json")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--compile", action="store_true",
                        help="compile the model with torch.compile (the first steps wait for the compiler)")
    parser.add_argument("--log-every", type=int, default=50,
                        help="print a line every N steps: loss, learning rate, tokens/s and, on a known GPU, MFU")
    parser.add_argument("--fsdp", action="store_true",
                        help="shard weights, gradients and optimizer state over the processes (FSDP2 fully_shard) "
                             "instead of replicating them (DDP)")
    return parser.parse_args(argv)


def _setup_distributed(device_arg: str | None) -> tuple[int, int, torch.device]:
    """(rank, world size, device); joins the process group when launched by torchrun."""
    use_cuda = torch.cuda.is_available() if device_arg is None else device_arg.startswith("cuda")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, torch.device("cuda" if use_cuda else "cpu")
    local_rank = int(os.environ["LOCAL_RANK"])
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def _full_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sharded: bool) -> tuple[dict, dict]:
    """Whole (unsharded) state dicts of the model and optimizer; with FSDP every process must call it."""
    if not sharded:
        return getattr(model, "module", model).state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def _load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a checkpoint written by an FSDP run into the sharded model and optimizer."""
    if not state["extra"].get("fsdp"):
        raise ValueError("--fsdp --resume needs a checkpoint written by an --fsdp run")
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, state["model"], options=options)
    set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)


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

    def __call__(self, step: int, history) -> None:
        done = step + 1
        if done % self.every and done != self.steps:
            return
        now = time.perf_counter()
        rate = (done - self.last_step) * self.tokens / (now - self.last)
        elapsed = now - self.start
        eta = elapsed / (done - self.start_step) * (self.steps - done)
        util = f"  MFU {mfu(rate, self.flops, self.peak):.1%}" if self.peak else ""
        progress_write(f"step {done}/{self.steps}  loss {history.train_loss[-1]:.4f}  lr {history.lr[-1]:.2e}  "
                       f"{rate:,.0f} tokens/s{util}  elapsed {elapsed:.0f} s  ETA {eta:.0f} s")
        self.last, self.last_step = now, done


def run(args: argparse.Namespace) -> dict:
    """Train as ``args`` say; return (on every rank) the run's summary: losses and world size."""
    for name in ("steps", "batch_size", "context", "warmup", "log_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    rank, world, device = _setup_distributed(args.device)
    try:
        if args.batch_size % world:
            raise ValueError(f"--batch-size {args.batch_size} must be divisible by the number of processes {world} "
                             "(each process takes an equal share of every batch)")
        checkpoint = args.out / "checkpoint.pt"
        if args.resume and not checkpoint.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint at {checkpoint}")
        seed_everything(args.seed)
        text = shakespeare_text("train")
        vocab = CharVocab.from_text(shakespeare_text("all"))  # every character of the plays has an id
        ids = vocab.encode(text)
        config = ModelConfig.preset(args.preset, vocab_size=len(vocab), max_len=max(args.context, 1), dropout=0.0)
        model = gpt = GPT(config).to(device)
        optimizer = adamw(model, lr=args.lr)
        data = torch.Generator().manual_seed(args.seed)
        done, history = 0, {"train_loss": [], "eval_loss": []}
        if args.resume:
            sharded = args.fsdp and world > 1  # sharded states are loaded after fully_shard, below
            state = load_checkpoint(checkpoint, model=None if sharded else model,
                                    optimizer=None if sharded else optimizer, generators={"data": data})
            if state["extra"].get("fsdp") and not sharded:
                raise ValueError(f"{checkpoint} was written by an --fsdp run: resume it with --fsdp")
            done, history = state["step"], state["extra"]["history"]
        if world > 1 and args.fsdp:
            from torch.distributed.fsdp import fully_shard

            for block in model.layers:  # each block's weights gathered just in time, then freed
                fully_shard(block)
            fully_shard(model)
            optimizer = adamw(model, lr=args.lr)  # over the sharded parameters
            if args.resume:
                _load_sharded(model, optimizer, state)
        elif world > 1:
            model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        if args.compile:  # in place, so that state_dict() keeps its keys; after DDP/FSDP wrapping
            gpt.compile()
        share = args.batch_size // world

        def batch(_: int) -> tuple[torch.Tensor, torch.Tensor]:
            # Every process draws the same global batch, then keeps its own rows.
            starts = torch.randint(0, len(ids) - args.context - 1, (args.batch_size,), generator=data)
            mine = starts[rank * share : (rank + 1) * share]
            rows = torch.stack([ids[s : s + args.context + 1] for s in mine.tolist()])
            return rows[:, :-1], rows[:, 1:]

        eval_gen = torch.Generator().manual_seed(10_000 + args.seed)
        val_ids = vocab.encode(shakespeare_text("validation"))
        starts = torch.randint(0, len(val_ids) - args.context - 1, (4 * 16,), generator=eval_gen)
        rows = torch.stack([val_ids[s : s + args.context + 1] for s in starts.tolist()])
        eval_batches = [(r[:, :-1], r[:, 1:]) for r in rows.split(16)]
        remaining = args.steps - done
        if remaining > 0:
            # Noam-shaped (Vaswani et al., 2017): a function of the step alone, so a run resumed with
            # a larger --steps continues exactly as a longer run would have.
            rate = noam(config.d_model, args.warmup)
            peak = rate(args.warmup)

            def schedule(step: int) -> float:
                return rate(step + 1) / peak

            log = StepLog(gpt, args, device, start_step=done, world=world) if rank == 0 else None
            result = train(model, batch, remaining, loss_fn=cross_entropy_loss, optimizer=optimizer,
                           lr_schedule=schedule, start_step=done, precision=args.precision, device=device,
                           progress=rank == 0, desc=f"rank {rank}", on_step=log)
            history["train_loss"] += result.train_loss
            history["eval_loss"].append([args.steps, evaluate(model, eval_batches, device=device)])
        summary = {"world_size": world, "steps": args.steps, **history}
        model_state, optimizer_state = _full_states(model, optimizer, args.fsdp and world > 1)
        if rank == 0:
            save_checkpoint(checkpoint, model=model_state, optimizer=optimizer_state, step=args.steps,
                            generators={"data": data},
                            extra={"history": history, "preset": args.preset, "vocab": "".join(vocab.itos),
                                   "fsdp": bool(args.fsdp and world > 1)})
            (args.out / "history.json").write_text(json.dumps(summary))
            print(f"{args.steps} steps on {world} process(es): train loss {history['train_loss'][-1]:.4f}, "
                  f"validation loss {history['eval_loss'][-1][1]:.4f} -> {checkpoint}")
        if world > 1:
            dist.barrier()
        return summary
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m companion.train``."""
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
