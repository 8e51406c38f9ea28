"""The training loop: a readable recipe that scales from a laptop to several GPUs.

``train`` is one screen of code: AdamW (decay on weight matrices only, :mod:`.optim`), an
optional learning-rate schedule (:mod:`.schedules`), gradient accumulation, mixed precision,
gradient clipping, periodic evaluation, a progress bar and a returned loss history. Anything
model-specific lives in two callables the caller passes in: one that makes a batch, one that
turns a batch into a loss (:mod:`.losses`).

* **Gradient accumulation**: each optimizer step consumes ``accumulation_steps`` consecutive
  micro-batches, each loss divided by their number, so for mean losses over equal-size
  micro-batches the step equals one step on their concatenation — a large batch in small memory.
* **Mixed precision**: ``precision="bf16"`` runs the forward pass under ``torch.autocast`` in
  bfloat16 (CPU and CUDA; weights, gradients and the optimizer stay float32, Micikevicius et al.,
  2018); ``"fp16"`` also scales the loss (``torch.amp.GradScaler``) so small gradients do not
  underflow, and needs CUDA.
* **Several processes**: wrap the model in ``DistributedDataParallel`` and give each process its
  share of every batch; the loop records the loss averaged over the processes
  (:mod:`companion.train` does this under ``torchrun``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from companion._validation import check_choice, check_int
from companion.training.losses import cross_entropy_loss
from companion.training.optim import adamw, optimizer_to_params
from companion.utils import get_device
from companion.utils import progress as progress_bar

__all__ = ["PRECISIONS", "TrainHistory", "train", "evaluate"]

PRECISIONS = ("fp32", "bf16", "fp16")

Batch = Any  # a tensor, or a tuple/list/dict of tensors
BatchFn = Callable[[int], Batch]  # micro-batch index -> batch
LossFn = Callable[[nn.Module, Batch], torch.Tensor]


@dataclass
class TrainHistory:
    """What happened during :func:`train`.

    ``train_loss[i]`` is the loss of step ``i``; ``eval_steps[j]`` is the step after which the
    ``j``-th evaluation ran and ``eval_loss[j]`` its result; ``lr[i]`` the learning rate of step ``i``.
    """

    train_loss: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)


def _to_device(batch: Batch, device: torch.device) -> Batch:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[Batch] | Callable[[], list[Batch]], loss_fn: LossFn = cross_entropy_loss,
             device: torch.device | str | None = None) -> float:
    """Mean of ``loss_fn`` over ``batches`` with the model in eval mode (restored afterwards)."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    batches = batches() if callable(batches) else batches
    if not batches:
        raise ValueError("batches must hold at least one batch")
    was_training = model.training
    model.eval()
    try:
        return sum(loss_fn(model, _to_device(b, device)).item() for b in batches) / len(batches)
    finally:
        model.train(was_training)


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def _world_mean(value: torch.Tensor) -> float:
    """``value`` averaged over the processes of a distributed run (itself otherwise)."""
    if dist.is_available() and dist.is_initialized():
        value = value.detach().clone()
        dist.all_reduce(value)  # SUM: gloo has no AVG
        value /= dist.get_world_size()
    return value.item()


def train(
    model: nn.Module,
    batch_fn: BatchFn,
    steps: int,
    *,
    loss_fn: LossFn = cross_entropy_loss,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    betas: tuple[float, float] = (0.9, 0.99),
    grad_clip: float | None = 1.0,
    lr_schedule: Callable[[int], float] | None = None,
    eval_batches: list[Batch] | Callable[[], list[Batch]] | None = None,
    eval_every: int = 0,
    eval_loss_fn: LossFn | None = None,
    device: torch.device | str | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    accumulation_steps: int = 1,
    precision: str = "fp32",
    start_step: int = 0,
    progress: bool = True,
    desc: str = "train",
    on_step: Callable[[int, TrainHistory], None] | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> TrainHistory:
    """Train ``model`` for ``steps`` optimizer steps and return its :class:`TrainHistory`.

    Args:
        model: moved to ``device`` (default: :func:`companion.utils.get_device`).
        batch_fn: ``micro-batch index -> batch``, called with 0, 1, 2, … (one index per
            micro-batch, continuing from ``start_step · accumulation_steps``); the batch is moved
            to the device for you.
        steps: number of optimizer steps.
        loss_fn: ``(model, batch) -> scalar loss``; default :func:`~.losses.cross_entropy_loss`.
        lr, weight_decay, betas: AdamW's hyper-parameters (ignored if ``optimizer`` is given);
            the default optimizer decays weight matrices only (:func:`~.optim.adamw`).
        grad_clip: clip the global gradient norm to this value; ``None`` disables clipping.
        lr_schedule: ``step -> multiplier`` of each group's initial rate, with the 0-based step
            index (e.g. :func:`~.schedules.warmup_cosine_schedule`).
        eval_batches, eval_every: every ``eval_every`` steps, and after the last step, the mean
            loss over ``eval_batches`` is recorded (``eval_every=0``: after the last step only).
        eval_loss_fn: the loss to evaluate with; default ``loss_fn`` (pass the plain loss when
            training with a regularised one, e.g. label smoothing).
        optimizer: use this one (e.g. restored from a checkpoint) instead of a new AdamW.
        accumulation_steps: micro-batches per optimizer step.
        precision: ``"fp32"``, ``"bf16"`` (autocast, CPU or CUDA) or ``"fp16"`` (autocast and a
            gradient scaler; CUDA only).
        start_step: steps already done (resuming): offsets the schedule and the batch indices.
        progress: show a progress bar with the running loss.
        on_step: called after every optimizer step with the 0-based step index and the history
            so far (a log line, a checkpoint).
        scaler: with ``precision="fp16"``, use this gradient scaler (e.g. restored from a
            checkpoint, so that a resumed run scales and skips steps as the uninterrupted one)
            instead of a new one.
    """
    check_int("steps", steps, 1)
    check_int("accumulation_steps", accumulation_steps, 1)
    check_int("start_step", start_step, 0)
    check_choice("precision", precision, PRECISIONS)
    if eval_every < 0 or (eval_every > 0 and eval_batches is None):
        raise ValueError(f"eval_every must be >= 0 and needs eval_batches when > 0, got {eval_every}")
    device = get_device(device)
    if precision == "fp16" and device.type != "cuda":
        raise ValueError(f"precision='fp16' needs a CUDA device (fp16 training needs a gradient scaler); "
                         f"got device {device.type!r}: use precision='bf16' or 'fp32'")
    model.to(device).train()
    if optimizer is None:
        optimizer = adamw(model, lr=lr, weight_decay=weight_decay, betas=betas)
    else:  # built or restored before the model moved: its state follows the parameters
        optimizer_to_params(optimizer)
    # The schedule scales each group's *initial* rate (as torch's LR schedulers do), so a second
    # call with the same optimizer starts from the original rate, not the last scheduled one.
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
    if precision != "fp16":
        scaler = None
    elif scaler is None:
        scaler = torch.amp.GradScaler("cuda")
    no_sync = getattr(model, "no_sync", None)  # DistributedDataParallel: sync gradients once per step
    history = TrainHistory()

    bar = progress_bar(range(start_step, start_step + steps), enabled=progress, desc=desc, leave=False,
                       mininterval=0.5)
    for step in bar:
        if lr_schedule is not None:
            for group, base in zip(optimizer.param_groups, base_lrs):
                group["lr"] = base * lr_schedule(step)
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for micro in range(accumulation_steps):
            last_micro = micro == accumulation_steps - 1
            sync = contextlib.nullcontext() if last_micro or no_sync is None else no_sync()
            with sync:
                with _autocast(precision, device):
                    loss = loss_fn(model, _to_device(batch_fn(step * accumulation_steps + micro), device))
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"loss became {loss.item()} at step {step}")
                scaled = loss.float() / accumulation_steps
                (scaler.scale(scaled) if scaler is not None else scaled).backward()
            total += scaled.detach()
        if scaler is not None:
            scaler.unscale_(optimizer)
        max_norm = grad_clip if grad_clip is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()

        history.train_loss.append(_world_mean(total))
        history.grad_norm.append(float(grad_norm))
        history.lr.append(optimizer.param_groups[0]["lr"])
        done = step - start_step + 1
        last = done == steps
        if eval_batches is not None and (last or (eval_every and done % eval_every == 0)):
            history.eval_steps.append(step + 1)
            history.eval_loss.append(evaluate(model, eval_batches, eval_loss_fn or loss_fn, device))
        if done % 10 == 1 or last:
            bar.set_postfix(loss=f"{history.train_loss[-1]:.3f}")
        if on_step is not None:
            on_step(step, history)
    return history
