"""Counting a Transformer's arithmetic, and how much of a GPU's peak a training run uses (MFU).

Training a decoder on one token costs about ``6 N`` floating-point operations for its ``N``
parameters: each weight is used in one multiply-add (2 FLOPs) in the forward pass and in two in
the backward pass (the gradients of the input and of the weight), so ``2 + 4 = 6`` per weight
(Kaplan et al., 2020, §2.1). Attention adds the score and weighted-sum products, which have no
weights: ``2 · 2 · T · d`` per layer and token forward (``q·k`` over ``T`` keys and the weighted
sum of ``T`` values, ``d = d_model``), three times that with the backward pass::

    FLOPs per token  ≈  6 N + 12 · L · T · d          (Chowdhery et al., 2022, App. B)

The attention term is PaLM's convention: it credits every query with all ``T`` keys, although a
causal model's queries see ``T / 2`` on average and a fused causal kernel skips the masked half
(Kaplan et al. count half as much, ``6 · L · T · d``). ``N`` counts every parameter, the position
table's too, which takes no matrix product (nanoGPT leaves it out). Compare MFUs computed the same
way.

**Model FLOPs utilisation** (MFU) divides the FLOPs this formula credits per second by the
hardware's peak: the share of the chip the model's own arithmetic uses. Recomputed activations and
the optimizer's work are not credited, so MFU compares implementations of one model fairly; 100%
is unreachable, since memory traffic, kernel launches and the optimizer take time without adding
model FLOPs.
"""

from __future__ import annotations

import torch

from companion._validation import check_int, check_positive_float

__all__ = ["flops_per_token", "PEAK_BF16_FLOPS", "peak_flops", "mfu"]

# Dense bf16 tensor-core peaks from the vendors' data sheets (without 2:4 sparsity), FLOP/s.
# Checked in order: the first name that occurs in torch.cuda.get_device_name() wins.
PEAK_BF16_FLOPS: dict[str, float] = {
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,  # SXM
    "H200 NVL": 835e12,
    "H200": 989e12,
    "GH200": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
    "L4": 121e12,
}


def flops_per_token(n_params: int, n_layers: int, seq_len: int, d_model: int) -> int:
    """Training FLOPs per token, ``6 N + 12 · L · T · d`` (forward and backward).

    Args:
        n_params: ``N``, every parameter counted once (tied embeddings once).
        n_layers: ``L``, attention layers.
        seq_len: ``T``, tokens each query attends over (the training context).
        d_model: ``d``, the width of the queries and keys summed over heads.
    """
    for name, value in (("n_params", n_params), ("n_layers", n_layers), ("seq_len", seq_len),
                        ("d_model", d_model)):
        check_int(name, value)
    return 6 * n_params + 12 * n_layers * seq_len * d_model


def peak_flops(device: torch.device | str) -> float | None:
    """The dense bf16 peak (FLOP/s) of a CUDA ``device`` from :data:`PEAK_BF16_FLOPS`; None if unknown.

    None too for CPU and MPS devices, whose peak depends on clock, cores and vector units.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS.items() if key in name), None)


def mfu(tokens_per_second: float, flops_per_token: float, peak: float) -> float:
    """Model FLOPs utilisation: ``tokens/s · FLOPs per token / peak FLOP/s``, a fraction."""
    for name, value in (("tokens_per_second", tokens_per_second), ("flops_per_token", flops_per_token),
                        ("peak", peak)):
        check_positive_float(name, value)
    return tokens_per_second * flops_per_token / peak
