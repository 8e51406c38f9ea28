"""Grouped-query attention from a trained multi-head model: mean-pool the key/value heads.

While a model generates, every layer keeps the keys and values of every earlier token, and each
new token reads all of them: the KV cache, ``2 · n_layers · n_kv_heads · head_dim`` numbers per
token (:func:`~companion.attention.kv_cache_bytes`), is what long contexts and large batches run
out of. Grouped-query attention (GQA) lets each group of ``n_heads / n_kv_heads`` consecutive
query heads share one key/value head, so the cache shrinks by that factor; ``n_kv_heads = 1`` is
multi-query attention (MQA, Shazeer, 2019). Query head ``h`` reads key/value head
``h // (n_heads / n_kv_heads)``, the convention of :class:`~companion.attention.MultiHeadAttention`.

A model trained with many key/value heads need not be trained again from scratch. Ainslie et al.
(2023, §2.1) convert the checkpoint by *mean-pooling* the key and value projections of the heads
in each group, then "uptrain" the result for a few percent of the original steps. With ``r``
old key/value heads per new one, new head ``j`` gets::

    W_K'^(j) = (1/r) · Σ_{i = j·r … j·r + r − 1} W_K^(i)        (the same for W_V and the biases)

where ``W_K^(i)`` is the ``(head_dim, d_model)`` block of rows of head ``i``. Query heads
``j·r·g … (j+1)·r·g − 1`` (``g`` query heads per old key/value head) used old heads
``j·r … j·r + r − 1`` and now all use head ``j``: pooling *consecutive* key/value heads keeps every
query head in its group. The pooled model is not the old one — a mean of keys is not a mean of
attention patterns — except when the heads of a group were equal already; the paper found mean
pooling the best of the starting points it tried (better than keeping one head, or a random
init), and uptraining closes most of the remaining gap.

With RoPE, keys are rotated *after* the projection, so the pooled model rotates pooled keys. That
is the pool of the rotated keys: the rotation at a position is linear and the same for every head.

::

    model = GPT(ModelConfig.preset("tiny", vocab_size=64))     # 4 query heads, 4 key/value heads
    mqa = to_gqa(model, 1)                                     # one key/value head: MQA
    mqa.config.n_kv_heads, mqa.make_cache(1).memory_bytes      # 1, a quarter of model's cache
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from companion._validation import check_int
from companion.attention import MultiHeadAttention
from companion.models.gpt import GPT

__all__ = ["pool_kv_heads", "to_gqa"]


def _check_n_kv_heads(n_kv_heads: object, current: int, name: str = "n_kv_heads") -> int:
    if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1 or current % n_kv_heads:
        divisors = [d for d in range(1, current + 1) if current % d == 0]
        raise ValueError(f"{name} must be an int that divides the current number of key/value heads "
                         f"{current} (one of {divisors}), got {n_kv_heads!r}")
    return n_kv_heads


def pool_kv_heads(in_proj: Tensor, n_heads: int, n_kv_heads: int, new_n_kv_heads: int) -> Tensor:
    """Mean-pool the key and value heads of a fused q/k/v projection into ``new_n_kv_heads`` heads.

    Args:
        in_proj: the weight ``((n_heads + 2 · n_kv_heads) · head_dim, d_model)`` or the bias
            ``((n_heads + 2 · n_kv_heads) · head_dim,)`` of a
            :class:`~companion.attention.MultiHeadAttention`'s ``in_proj``: the query rows, then
            the key rows, then the value rows, each head a block of ``head_dim`` consecutive rows.
        n_heads: query heads.
        n_kv_heads: key/value heads of ``in_proj``.
        new_n_kv_heads: key/value heads of the result; must divide ``n_kv_heads``.

    Returns:
        ``((n_heads + 2 · new_n_kv_heads) · head_dim, d_model)`` (or the matching bias): the query
        rows unchanged, and new key (value) head ``j`` the mean of old heads ``j·r … j·r + r − 1``,
        ``r = n_kv_heads / new_n_kv_heads``. Computed in float32 at least, returned in
        ``in_proj``'s dtype.
    """
    if not isinstance(in_proj, Tensor) or not in_proj.is_floating_point():
        got = in_proj.dtype if isinstance(in_proj, Tensor) else type(in_proj).__name__
        raise TypeError(f"in_proj must be a floating-point torch.Tensor, got {got}")
    if in_proj.dim() not in (1, 2):
        raise ValueError(f"in_proj must be a weight (out_features, in_features) or a bias (out_features,), "
                         f"got shape {tuple(in_proj.shape)}")
    check_int("n_heads", n_heads)
    check_int("n_kv_heads", n_kv_heads)
    _check_n_kv_heads(new_n_kv_heads, n_kv_heads, "new_n_kv_heads")
    rows = in_proj.shape[0]
    if rows % (n_heads + 2 * n_kv_heads):
        raise ValueError(f"in_proj must have (n_heads + 2 · n_kv_heads) · head_dim = {n_heads + 2 * n_kv_heads} · "
                         f"head_dim rows, got {rows}")
    head_dim = rows // (n_heads + 2 * n_kv_heads)
    q, k, v = in_proj.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim])
    r = n_kv_heads // new_n_kv_heads
    compute = torch.promote_types(in_proj.dtype, torch.float32)

    def pool(t: Tensor) -> Tensor:
        # (n_kv_heads · head_dim, ...) -> (new_n_kv_heads, r, head_dim, ...): consecutive heads form a group
        grouped = t.to(compute).reshape(new_n_kv_heads, r, head_dim, *t.shape[1:])
        return grouped.mean(1).reshape(new_n_kv_heads * head_dim, *t.shape[1:]).to(in_proj.dtype)

    return torch.cat([q, pool(k), pool(v)])


def to_gqa(model: GPT, n_kv_heads: int) -> GPT:
    """A copy of ``model`` with ``n_kv_heads`` key/value heads per layer, made by mean-pooling its heads.

    Every layer's key and value projections (weights and biases) are pooled by
    :func:`pool_kv_heads`; every other weight is copied. The result is a new :class:`GPT` built from
    ``dataclasses.replace(model.config, n_kv_heads=n_kv_heads)``, on ``model``'s device and dtype, in
    its train/eval mode and with its ``requires_grad`` flags; ``model`` is left unchanged, and so
    is the global random state. ``n_kv_heads`` equal to the current number gives the same model;
    ``1`` gives multi-query attention. Uptrain the result (Ainslie et al., 2023) to recover quality.

    Args:
        model: a :class:`~companion.models.gpt.GPT` with ``model.config.resolved_n_kv_heads``
            key/value heads, its attention projections plain ``nn.Linear`` (not quantized).
        n_kv_heads: key/value heads of the result; must divide the current number.
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a companion GPT, got {type(model).__name__}")
    config = model.config
    _check_n_kv_heads(n_kv_heads, config.resolved_n_kv_heads)
    attentions = {name: m for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)}
    for name, attn in attentions.items():
        if type(attn.in_proj) is not nn.Linear:
            raise TypeError(f"{name}.in_proj must be an nn.Linear to pool its heads, got {type(attn.in_proj).__name__}")

    state = model.state_dict()
    with torch.no_grad():
        for name, attn in attentions.items():
            for kind in ("weight", "bias"):
                key = f"{name}.in_proj.{kind}"
                if key in state:
                    state[key] = pool_kv_heads(state[key], attn.n_heads, attn.n_kv_heads, n_kv_heads)

    weight = next(model.parameters())
    with torch.random.fork_rng(devices=[]):  # the new model's random init is overwritten: leave the seed alone
        new = GPT(dataclasses.replace(config, n_kv_heads=n_kv_heads))
    new.to(device=weight.device, dtype=weight.dtype)
    new.load_state_dict(state)  # strict: the pooled weights fill exactly the architecture the config describes
    flags = dict(model.named_parameters())
    for name, p in new.named_parameters():
        p.requires_grad_(flags[name].requires_grad)
    return new.train(model.training)
