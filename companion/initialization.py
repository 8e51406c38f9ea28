"""Initial weights of the book's models, from their configuration.

GPT-2's scheme (Radford et al., 2019, §2.3), used whenever ``config.init_std`` is set: every
projection and embedding drawn from N(0, init_std²), biases zero, and the projections that write
into the residual stream (attention's ``out_proj``, the FFN's output) scaled down by
``1/√(2 · depth)``, so the stream's variance does not grow with depth. With ``init_std=None`` the
modules keep PyTorch's defaults (as ``torch.nn.Transformer`` does). Either way, token embeddings
that are multiplied by ``√d_model`` (the original Transformer) start at N(0, 1/d_model), so they
enter the model at unit scale.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from torch import nn

from companion.attention import MultiHeadAttention
from companion.config import ModelConfig
from companion.feedforward import FeedForward, GatedFeedForward
from companion.positional import LearnedPositionalEmbedding

__all__ = ["init_weights"]


def init_weights(model: nn.Module, config: ModelConfig, depth: int, token_embeddings: Iterable[nn.Embedding]) -> None:
    """Initialise ``model``'s weights in place as ``config`` says (see the module docstring).

    Args:
        model: the whole model.
        config: its configuration (``init_std``, ``scale_embeddings``, ``d_model``).
        depth: the number of blocks whose outputs add up in one residual stream.
        token_embeddings: the token embedding tables (scaled by ``√d_model`` if the config says so).
    """
    std = config.init_std
    if std is not None:
        residual_std = std / math.sqrt(2 * depth)
        for module in model.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.Embedding, LearnedPositionalEmbedding)):
                nn.init.normal_(module.weight, std=std)
        for module in model.modules():  # the projections that write into the residual stream
            if isinstance(module, MultiHeadAttention):
                nn.init.normal_(module.out_proj.weight, std=residual_std)
            elif isinstance(module, FeedForward):
                nn.init.normal_(module.w2.weight, std=residual_std)
            elif isinstance(module, GatedFeedForward):
                nn.init.normal_(module.w_out.weight, std=residual_std)
    if config.scale_embeddings:
        for embedding in token_embeddings:
            nn.init.normal_(embedding.weight, std=config.d_model**-0.5)
