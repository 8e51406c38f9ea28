"""Random weights for parity tests: a freshly initialised model leaves norms at 1 and biases at 0.

Comparing two libraries on fresh models would not see a swapped pair of LayerNorms (both at
weight 1, bias 0) or a bias copied to the wrong place (all zeros). :func:`randomize_` gives every
parameter its own random values first, so each one must land where it belongs.
"""

import torch
from torch import nn


@torch.no_grad()
def randomize_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter of ``model`` drawn afresh, in place (tied parameters stay tied); returns it.

    Matrices and tables: N(0, 1/fan_in) so activations keep their scale; vectors (norm weights,
    biases): their current value plus N(0, 0.2²), so norm weights stay near 1 and no two are equal.
    """
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        noise = torch.randn(p.shape, generator=g).to(p)
        if p.dim() >= 2:
            p.copy_(noise * p.shape[-1] ** -0.5)
        else:
            p.add_(0.2 * noise)
    return model
