"""A small, readable training loop that later chapters extend.

``train`` is deliberately one screen of code: AdamW, optional learning-rate schedule, gradient
clipping, periodic evaluation, a ``tqdm`` progress bar and a returned loss history. Anything
model-specific lives in two callables the caller passes in: one that makes a batch, one that
turns a batch into a loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from companion.utils import get_device
from companion.utils import progress as progress_bar

__all__ = ["TrainHistory", "train", "evaluate", "cross_entropy_loss", "warmup_cosine_schedule"]

Batch = Any  # a tensor, or a tuple/list/dict of tensors
BatchFn = Callable[[int], Batch]  # step -> batch
LossFn = Callable[[nn.Module, Batch], torch.Tensor]


def cross_entropy_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of ``model(inputs)`` against integer ``targets``.

    ``batch`` is ``(inputs, targets)``; logits of shape ``(..., n_classes)`` are compared with
    targets of shape ``(...)``, so it serves classifiers ``(batch,)`` and language models
    ``(batch, seq)`` alike.
    """
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def warmup_cosine_schedule(warmup_steps: int, total_steps: int, min_ratio: float = 0.1) -> Callable[[int], float]:
    """Learning-rate multiplier: linear warm-up to 1, then cosine decay to ``min_ratio``."""
    if warmup_steps < 0 or total_steps < 1 or warmup_steps > total_steps:
        raise ValueError(
            f"need 0 <= warmup_steps <= total_steps and total_steps >= 1, got {warmup_steps}, {total_steps}"
        )

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return multiplier


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
    device: torch.device | str | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    progress: bool = True,
    desc: str = "train",
) -> TrainHistory:
    """Train ``model`` for ``steps`` optimizer steps and return its :class:`TrainHistory`.

    Args:
        model: moved to ``device`` (default: :func:`companion.utils.get_device`).
        batch_fn: ``step -> batch``; the batch is moved to the device for you.
        steps: number of optimizer steps.
        loss_fn: ``(model, batch) -> scalar loss``; default :func:`cross_entropy_loss`.
        lr, weight_decay, betas: AdamW's hyper-parameters (ignored if ``optimizer`` is given).
        grad_clip: clip the global gradient norm to this value; ``None`` disables clipping.
        lr_schedule: ``step -> multiplier`` of ``lr`` (e.g. :func:`warmup_cosine_schedule`).
        eval_batches, eval_every: every ``eval_every`` steps, and after the last step, the mean
            loss over ``eval_batches`` is recorded (``eval_every=0``: after the last step only).
        progress: show a ``tqdm`` progress bar with the running loss.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if eval_every < 0 or (eval_every > 0 and eval_batches is None):
        raise ValueError(f"eval_every must be >= 0 and needs eval_batches when > 0, got {eval_every}")
    device = get_device(device)
    model.to(device).train()
    if optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)
    # The schedule scales each group's *initial* rate (as torch's LR schedulers do), so a second
    # call with the same optimizer starts from the original rate, not the last scheduled one.
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
    history = TrainHistory()

    bar = progress_bar(range(steps), enabled=progress, desc=desc, leave=False, mininterval=0.5)
    for step in bar:
        if lr_schedule is not None:
            for group, base in zip(optimizer.param_groups, base_lrs):
                group["lr"] = base * lr_schedule(step)
        loss = loss_fn(model, _to_device(batch_fn(step), device))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss became {loss.item()} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        max_norm = grad_clip if grad_clip is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()

        history.train_loss.append(loss.item())
        history.grad_norm.append(float(grad_norm))
        history.lr.append(optimizer.param_groups[0]["lr"])
        last = step == steps - 1
        if eval_batches is not None and (last or (eval_every and (step + 1) % eval_every == 0)):
            history.eval_steps.append(step + 1)
            history.eval_loss.append(evaluate(model, eval_batches, loss_fn, device))
        if step % 10 == 0 or last:
            bar.set_postfix(loss=f"{history.train_loss[-1]:.3f}")
    return history
