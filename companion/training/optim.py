"""The optimizer of the recipe: AdamW (Loshchilov & Hutter, 2019) with decay on weight matrices only.

Adam's L2 penalty is scaled by the adaptive denominator, so weights with large gradients are
barely regularised; AdamW *decouples* weight decay from the gradient step,
``θ ← θ − lr · (m̂ / (√v̂ + ε) + λ θ)``. Here the decay applies to the matrices of linear layers
only. Biases and normalisation gains are excluded, as BERT's optimiser (by name: ``LayerNorm``,
``bias``) and Hugging Face's training scripts exclude them: shrinking a gain towards zero has no
regularising purpose. Embeddings (token and position tables) are a choice recipes differ on:
BERT, nanoGPT and Hugging Face's ``Trainer`` decay them, minGPT does not. We do not: an untied
embedding row gets a gradient only when its token occurs (a tied one gets a small one at every
step), while decay would shrink it at every step. Tied, the output layer is then not decayed either.
"""

from __future__ import annotations

import torch
from torch import nn

from companion.normalization import LayerNorm, RMSNorm
from companion.positional import LearnedPositionalEmbedding, T5RelativePositionBias

__all__ = ["param_groups", "adamw", "optimizer_to_params"]

_NO_DECAY_MODULES = (nn.Embedding, LearnedPositionalEmbedding, T5RelativePositionBias, LayerNorm, RMSNorm,
                     nn.LayerNorm, nn.RMSNorm)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two optimizer groups: the weight matrices of linear layers (decayed), and everything else (not).

    A parameter shared by two modules (tied embeddings) is listed once, and not decayed if any of
    its owners is an embedding or a norm: an embedding matrix tied to the output layer is not decayed.
    """
    no_decay: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if isinstance(module, _NO_DECAY_MODULES) or p.dim() < 2:
                no_decay[id(p)] = p
    params = {id(p): p for p in model.parameters() if p.requires_grad}
    decay = [p for key, p in params.items() if key not in no_decay]
    rest = [p for key, p in params.items() if key in no_decay]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def adamw(model: nn.Module, lr: float = 3e-3, weight_decay: float = 0.01,
          betas: tuple[float, float] = (0.9, 0.99)) -> torch.optim.AdamW:
    """``torch.optim.AdamW`` over :func:`param_groups` of ``model``."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas)


def optimizer_to_params(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Move each parameter's optimizer state (Adam's moments, ...) onto that parameter's device.

    ``optimizer.load_state_dict`` places the state where the parameters are *at load time*; a
    model moved afterwards (restored on the CPU, then trained on a GPU) leaves it behind, and the
    next ``optimizer.step()`` fails with "Expected all tensors to be on the same device". A scalar
    ``step`` counter stays where PyTorch keeps it (the CPU) unless the group is ``fused`` or
    ``capturable``, as in ``Optimizer.load_state_dict``. Returns ``optimizer``; in place.
    """
    for group in optimizer.param_groups:
        on_device_step = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state:
                continue
            for key, value in state.items():
                if not torch.is_tensor(value) or value.device == p.device:
                    continue
                if key == "step" and value.dim() == 0 and not on_device_step:
                    continue
                state[key] = value.to(p.device)
    return optimizer

