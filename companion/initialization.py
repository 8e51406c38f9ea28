"""Initial weights of the book's models, from their configuration.

GPT-2's scheme (Radford et al., 2019, §2.3), used whenever ``config.init_std`` is set: every
projection and embedding drawn from N(0, init_std²), biases zero, and the projections that write
into the residual stream (attention's ``out_proj``, the FFN's output) scaled down by
``1/√(2 · depth)``, so the stream's variance does not grow with depth. BERT (Devlin et al., 2019)
and Hugging Face's LLaMA draw every matrix from N(0, 0.02²) without that scaling:
``config.residual_init_scale=False``, as their presets set it. With ``init_std=None`` each
module keeps its own default: ``nn.Linear`` draws weights and biases uniform in ±1/√fan_in
(PyTorch's ``kaiming_uniform_`` with ``a=√5``, a third of LeCun's variance); ``nn.Embedding``
draws N(0, 1); :class:`~companion.attention.MultiHeadAttention` draws its query/key/value
projection Xavier-uniform and zeroes its biases, as ``torch.nn.MultiheadAttention`` does;
:class:`~companion.positional.LearnedPositionalEmbedding` draws N(0, 0.02²). That is not
``torch.nn.Transformer``'s scheme, which re-draws every matrix Xavier-uniform (Glorot & Bengio,
2010). Either way, token embeddings that are multiplied by ``√d_model`` (the original
Transformer) start at N(0, 1/d_model), so they enter the model at unit scale.

T5 has its own scheme (:func:`init_t5_weights`, Mesh TensorFlow's and Hugging Face's): every
matrix drawn from N(0, 1/fan_in), the token embeddings from N(0, 1), and, because T5 does not
divide its attention scores by ``√head_dim``, the query projection a further ``1/√head_dim``
smaller — the scale is folded into the initial weights instead of the scores.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from companion.attention import MultiHeadAttention
from companion.config import ModelConfig
from companion.feedforward import FeedForward, GatedFeedForward
from companion.positional import LearnedPositionalEmbedding, T5RelativePositionBias

__all__ = ["init_weights", "init_t5_weights"]


def init_weights(model: nn.Module, config: ModelConfig, depth: int, token_embeddings: Iterable[nn.Embedding]) -> None:
    """Initialise ``model``'s weights in place as ``config`` says (see the module docstring).

    Args:
        model: the whole model.
        config: its configuration (``init_std``, ``residual_init_scale``, ``scale_embeddings``, ``d_model``).
        depth: the number of blocks whose outputs add up in one residual stream.
        token_embeddings: the token embedding tables (scaled by ``√d_model`` if the config says so).
    """
    std = config.init_std
    if std is not None:
        residual_std = std / math.sqrt(2 * depth) if config.residual_init_scale else std
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


def init_t5_weights(model: nn.Module, config: ModelConfig, token_embeddings: Iterable[nn.Embedding],
                    output: nn.Linear | None = None) -> None:
    """T5's initial weights (Raffel et al., 2020; as Hugging Face's ``T5PreTrainedModel``), in place.

    Each projection is drawn from N(0, 1/fan_in): queries ``(d_model · head_dim)^-1/2`` when the
    scores are unscaled (``config.attention_scale == 1``, T5's choice; ``d_model^-1/2`` otherwise),
    keys and values ``d_model^-1/2``, attention output ``(heads · head_dim)^-1/2``, FFN input
    ``d_model^-1/2`` and output ``d_ff^-1/2``; token embeddings N(0, 1) (a tied output projection
    rescales the states by ``d_model^-1/2``), and an untied ``output`` projection N(0, 1) too
    (T5 v1.1; its states are not rescaled); relative position biases ``d_model^-1/2``; norms 1.

    T5 was trained with Adafactor (Shazeer & Stern, 2018), whose steps scale with each weight's
    size. Adam's steps do not: on the small query weights the same learning rate moves the
    attention scores ``√head_dim`` times further relative to their size than with
    ``attention_scale=None`` (Chapter 12, exercise 4, measures one step), which can slow a small
    T5 trained with AdamW.
    """
    d_model = config.d_model
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            d, q_rows = module.head_dim, module.n_heads * module.head_dim
            q_std = (d_model * d) ** -0.5 if config.attention_scale == 1.0 else d_model**-0.5
            with torch.no_grad():
                module.in_proj.weight[:q_rows].normal_(0.0, q_std)
                module.in_proj.weight[q_rows:].normal_(0.0, d_model**-0.5)  # keys and values
            nn.init.normal_(module.out_proj.weight, std=q_rows**-0.5)
        elif isinstance(module, FeedForward):
            nn.init.normal_(module.w1.weight, std=d_model**-0.5)
            nn.init.normal_(module.w2.weight, std=module.d_ff**-0.5)
        elif isinstance(module, GatedFeedForward):
            nn.init.normal_(module.w_gate.weight, std=d_model**-0.5)
            nn.init.normal_(module.w_in.weight, std=d_model**-0.5)
            nn.init.normal_(module.w_out.weight, std=module.d_ff**-0.5)
        elif isinstance(module, T5RelativePositionBias):
            nn.init.normal_(module.relative_attention_bias.weight, std=d_model**-0.5)
    for embedding in token_embeddings:
        nn.init.normal_(embedding.weight, std=1.0)
    if output is not None:
        nn.init.normal_(output.weight, std=1.0)
