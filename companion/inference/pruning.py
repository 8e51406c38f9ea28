"""Pruning: removing weights (unstructured) or whole neurons and heads (structured).

**Magnitude pruning** (Han et al., 2015) zeroes the fraction ``s`` of the weights with the
smallest ``|w|``, either over all the chosen ``nn.Linear`` layers at once (``scope="global"``:
one threshold, so layers with many small weights lose more) or in each layer separately
(``scope="layer"``: every matrix loses the same fraction)::

    mask_ij = |W_ij| > τ        τ = the ⌊s·N⌉-th smallest |w|        Ŵ = W ⊙ mask

Exactly ``round(s · N)`` weights are pruned (ties at ``τ`` broken by position; weights that are
already zero are the smallest, so pruning twice changes nothing). The matrices
keep their shapes, so a dense kernel multiplies the zeros like any other number: unstructured
sparsity saves nothing until a sparse format or kernel (e.g. NVIDIA's 2:4 semi-structured
sparsity, Mishra et al., 2021) exploits it.

**Structured pruning** removes whole rows and columns, so the matrices really shrink. A hidden
neuron ``j`` of the FFN owns row ``j`` of ``W_1`` (of ``W_gate`` and ``W_in`` for a gated FFN,
each with its bias) and column ``j`` of ``W_2``; a query head owns its ``head_dim`` rows of ``W^Q``
and columns of ``W^O``, and a key/value head its rows of ``W^K`` and ``W^V``. Removing them shrinks
``d_ff`` or ``n_heads`` (Michel et al., 2019, "Are Sixteen Heads Really Better than One?"; Ma et
al., 2023, LLM-Pruner). The units to remove are ranked by an importance score. The default is
data-free, a bound on how much the unit can write into the residual stream::

    FFN neuron j:   score_j = ‖[W_1[j], b_1[j]]‖ · ‖W_2[:, j]‖
    gated FFN:      score_j = ‖[W_gate[j], b_gate[j]]‖ · ‖[W_in[j], b_in[j]]‖ · ‖W_out[:, j]‖
    head h:         score_h = ‖[W^V_h, b^V_h]‖_F · ‖W^O_h‖_F      (W^V_h: the rows of h's key/value head)

Because ``|act(z)| ≤ |z|`` for ReLU, GELU and SiLU, neuron ``j``'s output is at most
``score_j · ‖[x, 1]‖`` (``‖[x, 1]‖²`` when gated); a head's output is a convex combination of its
values, so it is at most ``score_h · max ‖[x, 1]‖``. A unit of score 0 writes nothing, and pruning
it changes no output. The query and key rows are left out on purpose: they decide where a head
looks, not how much it writes. Scores measured on data (mean ``|activation|`` on calibration text,
as Minitron does, Muralidharan et al., 2024) are usually better: pass them as ``scores=``.

With grouped-query attention (``n_kv_heads < n_heads``) a key/value head serves a group of
``n_heads / n_kv_heads`` query heads, so :func:`prune_heads` removes whole groups (ranked by the
sum of their heads' scores). Every function returns a pruned copy; the model is unchanged::

    sparse = magnitude_prune(model, 0.5)              # half of the Linear weights zeroed, same shapes
    sparsity_of(sparse)                               # 0.5
    small = prune_heads(prune_ffn_neurons(model, 0.5), keep_heads=2)
    small.config.d_ff, small.config.n_heads           # (128, 2): the "tiny" GPT, 132,864 -> 83,264 parameters
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from companion._validation import check_choice
from companion.attention import MultiHeadAttention
from companion.feedforward import FeedForward, GatedFeedForward
from companion.models.gpt import GPT

__all__ = ["magnitude_masks", "magnitude_prune", "sparsity_of", "ffn_neuron_scores", "head_scores",
           "prune_ffn_neurons", "prune_heads"]

SCOPES = ("global", "layer")


# ----------------------------------------------------------------------------- unstructured


def _check_skip(skip: object) -> tuple[str, ...]:
    if isinstance(skip, str) or not isinstance(skip, (tuple, list)) or not all(isinstance(s, str) for s in skip):
        raise ValueError(f"skip must be a tuple of layer names, got {skip!r}")
    return tuple(skip)


def _linears(model: nn.Module, skip: tuple[str, ...]) -> list[tuple[str, nn.Linear]]:
    # the nn.Linear layers not named in skip, a shared weight (a tied head) once
    seen: set[int] = set()
    layers = []
    for name, module in model.named_modules():
        if (isinstance(module, nn.Linear) and id(module.weight) not in seen
                and not any(name == s or name.endswith("." + s) for s in skip)):
            seen.add(id(module.weight))
            layers.append((name, module))
    return layers


def _smallest(scores: Tensor, k: int) -> Tensor:
    # bool mask of exactly k of the 1-d scores, the smallest; ties at the threshold broken by position
    if k == 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    threshold = scores.kthvalue(k).values
    below, tied = scores < threshold, scores == threshold
    return below | (tied & (tied.cumsum(0) <= k - below.sum()))


def magnitude_masks(model: nn.Module, sparsity: float, *, scope: str = "global",
                    skip: tuple[str, ...] = ("head", "lm_head")) -> dict[str, Tensor]:
    """Which weights magnitude pruning keeps: ``{layer name: bool mask (out_features, in_features)}``, True = kept.

    Args:
        model: any module; its ``nn.Linear`` layers are pruned (a weight shared by two layers, as
            a tied LM head, counts once).
        sparsity: the fraction of weights to zero, in ``[0, 1]``: ``round(sparsity · N)`` of the
            ``N`` weights (of all layers for ``scope="global"``, of each for ``"layer"``).
        scope: ``"global"`` (one threshold for all layers) or ``"layer"`` (one per layer).
        skip: layers left dense; an entry matches a qualified name or its last parts (``"head"``
            matches ``"gpt.head"``). By default the LM head (companion's ``head``, HF's ``lm_head``).
    """
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not 0 <= sparsity <= 1:
        raise ValueError(f"sparsity must be a number in [0, 1] (the fraction of weights zeroed), got {sparsity!r}")
    check_choice("scope", scope, SCOPES)
    layers = _linears(model, _check_skip(skip))
    if not layers:
        raise ValueError(f"model has no nn.Linear layer left to prune (skip={skip!r})")
    dtype = torch.float64 if any(linear.weight.dtype == torch.float64 for _, linear in layers) else torch.float32
    scores = [linear.weight.detach().abs().to(dtype).flatten() for _, linear in layers]
    if scope == "global":
        flat = torch.cat([s.to(scores[0].device) for s in scores])
        pruned = _smallest(flat, round(sparsity * flat.numel())).split([s.numel() for s in scores])
    else:
        pruned = [_smallest(s, round(sparsity * s.numel())) for s in scores]
    return {name: ~p.to(linear.weight.device).view_as(linear.weight) for (name, linear), p in zip(layers, pruned)}


def magnitude_prune(model: nn.Module, sparsity: float, *, scope: str = "global",
                    skip: tuple[str, ...] = ("head", "lm_head")) -> nn.Module:
    """A copy of ``model`` with the smallest-``|w|`` fraction ``sparsity`` of its Linear weights set to zero.

    ``model`` is unchanged; arguments as :func:`magnitude_masks` (which gives the masks, e.g. to
    re-apply after each fine-tuning step). Shapes, biases, embeddings and norms are untouched.
    """
    masks = magnitude_masks(model, sparsity, scope=scope, skip=skip)
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, mask in masks.items():
            model.get_submodule(name).weight.masked_fill_(~mask, 0.0)
    return model


def sparsity_of(model: nn.Module, *, skip: tuple[str, ...] = ("head", "lm_head")) -> float:
    """The fraction of zeros among the weights :func:`magnitude_prune` would prune (same ``skip``)."""
    layers = _linears(model, _check_skip(skip))
    if not layers:
        raise ValueError(f"model has no nn.Linear layer outside skip={skip!r}")
    zeros = sum(int((linear.weight == 0).sum()) for _, linear in layers)
    return zeros / sum(linear.weight.numel() for _, linear in layers)


# ----------------------------------------------------------------------------- structured: scores


def _rows(linear: nn.Linear, rows: slice | None = None) -> Tensor:
    # the weight's rows with their bias as one more column: (rows, in_features [+ 1])
    w = linear.weight.detach()
    if linear.bias is not None:
        w = torch.cat([w, linear.bias.detach()[:, None]], dim=1)
    return w if rows is None else w[rows]


def _check_gpt(model: object) -> GPT:
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a companion GPT, got {type(model).__name__}")
    return model


def ffn_neuron_scores(model: GPT) -> Tensor:
    """The data-free importance of every FFN hidden neuron, ``(n_layers, d_ff)`` float32 (module docstring)."""
    scores = []
    for block in _check_gpt(model).layers:
        ffn = block.ffn
        if isinstance(ffn, GatedFeedForward):
            inputs = _rows(ffn.w_gate).float().norm(dim=1) * _rows(ffn.w_in).float().norm(dim=1)
            out = ffn.w_out
        else:
            inputs, out = _rows(ffn.w1).float().norm(dim=1), ffn.w2
        scores.append(inputs * out.weight.detach().float().norm(dim=0))
    return torch.stack(scores)


def head_scores(model: GPT) -> Tensor:
    """The data-free importance of every query head, ``(n_layers, n_heads)`` float32 (module docstring)."""
    scores = []
    for block in _check_gpt(model).layers:
        attn: MultiHeadAttention = block.self_attn
        h, hkv, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
        values = _rows(attn.in_proj, slice((h + hkv) * d, None)).float()  # (n_kv_heads · head_dim, d_model [+ 1])
        v_norm = values.reshape(hkv, -1).norm(dim=1).repeat_interleave(h // hkv)  # head i reads kv head i // group
        o_norm = attn.out_proj.weight.detach().float().reshape(-1, h, d).transpose(0, 1).reshape(h, -1).norm(dim=1)
        scores.append(v_norm * o_norm)
    return torch.stack(scores)


# ----------------------------------------------------------------------------- structured: pruning


def _count(name: str, keep: object, total: int) -> int:
    # keep: an int in [1, total], or a fraction in (0, 1] of total (rounded, at least 1)
    if not isinstance(keep, bool) and isinstance(keep, int) and 1 <= keep <= total:
        return keep
    if isinstance(keep, float) and 0 < keep <= 1:
        return max(1, round(keep * total))
    raise ValueError(f"{name} must be an int in [1, {total}] or a float fraction in (0, 1], got {keep!r}")


def _check_scores(scores: object, shape: tuple[int, int], what: str) -> Tensor:
    if not isinstance(scores, Tensor) or not scores.is_floating_point() or tuple(scores.shape) != shape:
        got = f"shape {tuple(scores.shape)}, dtype {scores.dtype}" if isinstance(scores, Tensor) else scores
        raise ValueError(f"scores must be a float tensor (n_layers, {what}) = {shape}, got {got!r}")
    return scores.detach().float()


def _top(scores: Tensor, k: int) -> Tensor:
    # indices of the k largest scores, in their original order (so keeping all changes nothing)
    return scores.topk(k).indices.sort().values.cpu()


def _sliced(linear: nn.Linear, rows: Tensor | None = None, cols: Tensor | None = None) -> nn.Linear:
    # a new, smaller nn.Linear with the given rows (outputs) and columns (inputs) of linear
    w, b = linear.weight.detach(), None if linear.bias is None else linear.bias.detach()
    if rows is not None:
        rows = rows.to(w.device)
        w, b = w[rows], None if b is None else b[rows]
    if cols is not None:
        w = w[:, cols.to(w.device)]
    new = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        new.weight.copy_(w)
        if b is not None:
            new.bias.copy_(b)
    return new


def prune_ffn_neurons(model: GPT, keep: int | float, *, scores: Tensor | None = None) -> GPT:
    """A copy of ``model`` whose FFNs keep only their ``keep`` most important hidden neurons per layer.

    Every block keeps the same number, so the copy's ``config.d_ff`` is that number and
    ``GPT(pruned.config)`` loads ``pruned.state_dict()``. The FFN's Linear layers are replaced by
    smaller ones: ``w1`` ``(keep, d_model)`` and ``w2`` ``(d_model, keep)`` (gated: ``w_gate``,
    ``w_in``, ``w_out``); the output bias stays. ``model`` is unchanged.

    Args:
        model: a :class:`~companion.models.gpt.GPT`.
        keep: neurons kept per layer, an int in ``[1, d_ff]``, or a float fraction in ``(0, 1]``
            of ``d_ff`` (rounded, at least 1): ``1`` keeps one neuron, ``1.0`` all.
        scores: importance ``(n_layers, d_ff)``, higher = kept; default :func:`ffn_neuron_scores`.
    """
    config = _check_gpt(model).config
    d_ff = config.resolved_d_ff
    k = _count("keep", keep, d_ff)
    scores = ffn_neuron_scores(model) if scores is None else _check_scores(scores, (config.n_layers, d_ff), "d_ff")
    pruned = copy.deepcopy(model)
    for block, layer_scores in zip(pruned.layers, scores):
        ffn, kept = block.ffn, _top(layer_scores, k)
        if isinstance(ffn, GatedFeedForward):
            ffn.w_gate, ffn.w_in = _sliced(ffn.w_gate, rows=kept), _sliced(ffn.w_in, rows=kept)
            ffn.w_out = _sliced(ffn.w_out, cols=kept)
        elif isinstance(ffn, FeedForward):
            ffn.w1, ffn.w2 = _sliced(ffn.w1, rows=kept), _sliced(ffn.w2, cols=kept)
        else:
            raise TypeError(f"unknown FFN {type(ffn).__name__}: expected a FeedForward or GatedFeedForward")
        ffn.d_ff = k
    pruned.config = config.replace(d_ff=k)
    return pruned


def prune_heads(model: GPT, keep_heads: int | float, *, scores: Tensor | None = None) -> GPT:
    """A copy of ``model`` whose self-attention keeps only its ``keep_heads`` most important query heads per layer.

    The removed heads' rows of ``in_proj`` (queries; keys and values with them when their
    key/value head goes) and columns of ``out_proj`` are dropped; ``head_dim`` is unchanged, so the
    copy's config has ``n_heads = keep_heads`` and an explicit ``head_dim`` and
    ``GPT(pruned.config)`` loads ``pruned.state_dict()``. With grouped-query attention whole
    groups go: ``keep_heads`` must be a multiple of ``n_heads / n_kv_heads`` and a group's score is
    the sum of its heads'. ``model`` is unchanged.

    Args:
        model: a :class:`~companion.models.gpt.GPT` whose positions are not per head (not
            ``"alibi"`` or ``"t5"``).
        keep_heads: query heads kept per layer, an int in ``[1, n_heads]`` or a float fraction in
            ``(0, 1]`` of ``n_heads`` (rounded, at least 1).
        scores: importance ``(n_layers, n_heads)``, higher = kept; default :func:`head_scores`.
    """
    config = _check_gpt(model).config
    if config.position in ("alibi", "t5"):
        raise ValueError(f"prune_heads needs positions that are not per head, got position={config.position!r} "
                         "(its score bias has one slope or table per head)")
    h, hkv, d = config.n_heads, config.resolved_n_kv_heads, config.resolved_head_dim
    group = h // hkv
    k = _count("keep_heads", keep_heads, h)
    if k % group:
        raise ValueError(f"keep_heads must be a multiple of n_heads / n_kv_heads = {group} (grouped-query attention: "
                         f"whole key/value groups are pruned), got {k}")
    scores = head_scores(model) if scores is None else _check_scores(scores, (config.n_layers, h), "n_heads")
    group_scores = scores.reshape(config.n_layers, hkv, group).sum(-1)  # (n_layers, n_kv_heads)
    pruned = copy.deepcopy(model)
    for block, layer_scores in zip(pruned.layers, group_scores):
        attn: MultiHeadAttention = block.self_attn
        groups = _top(layer_scores, k // group)  # kept key/value heads
        heads = (groups[:, None] * group + torch.arange(group)).flatten()  # their query heads, in order
        q = (heads[:, None] * d + torch.arange(d)).flatten()
        kv = (groups[:, None] * d + torch.arange(d)).flatten()
        attn.in_proj = _sliced(attn.in_proj, rows=torch.cat([q, h * d + kv, (h + hkv) * d + kv]))
        attn.out_proj = _sliced(attn.out_proj, cols=q)
        attn.n_heads, attn.n_kv_heads = k, k // group
    n_kv_heads = None if config.n_kv_heads is None else k // group
    pruned.config = config.replace(n_heads=k, n_kv_heads=n_kv_heads, head_dim=d)
    return pruned
