"""Training: the loop, the optimizer, learning-rate schedules, losses and checkpoints.

* :mod:`~companion.training.loop` — :func:`train` (accumulation, mixed precision, clipping,
  evaluation, distributed-aware logging), :func:`evaluate`, :class:`TrainHistory`;
* :mod:`~companion.training.optim` — :func:`adamw`, :func:`param_groups` (no decay on biases,
  norms and embeddings), :func:`optimizer_to_params` (state follows a moved model);
* :mod:`~companion.training.schedules` — :func:`noam`, :func:`warmup_cosine_schedule`,
  :func:`warmup_linear_schedule`;
* :mod:`~companion.training.losses` — :func:`label_smoothed_cross_entropy`,
  :func:`cross_entropy_loss`, :func:`teacher_forcing_loss`;
* :mod:`~companion.training.checkpoint` — :func:`save_checkpoint`, :func:`load_checkpoint`
  (atomic, resumable bit for bit), and a folder of them: :func:`checkpoint_path`,
  :func:`list_checkpoints`, :func:`prune_checkpoints`, :func:`read_latest_checkpoint`.

``python -m companion.train`` (:mod:`companion.train`) trains a GPT on Shakespeare with all of
this, on one process or several under ``torchrun``.
"""

from companion.training.checkpoint import (
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    read_latest_checkpoint,
    restore_checkpoint,
    rng_states,
    save_checkpoint,
    set_rng_states,
)
from companion.training.loop import PRECISIONS, TrainHistory, evaluate, train
from companion.training.losses import cross_entropy_loss, label_smoothed_cross_entropy, teacher_forcing_loss
from companion.training.optim import adamw, optimizer_to_params, param_groups
from companion.training.schedules import noam, warmup_cosine_schedule, warmup_linear_schedule

__all__ = [
    "train",
    "evaluate",
    "TrainHistory",
    "PRECISIONS",
    "adamw",
    "param_groups",
    "optimizer_to_params",
    "noam",
    "warmup_cosine_schedule",
    "warmup_linear_schedule",
    "label_smoothed_cross_entropy",
    "cross_entropy_loss",
    "teacher_forcing_loss",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint",
    "restore_checkpoint",
    "rng_states",
    "set_rng_states",
    "checkpoint_path",
    "list_checkpoints",
    "prune_checkpoints",
    "read_latest_checkpoint",
]
