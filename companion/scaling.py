"""Scaling laws: fitting ``L(N) = (N_c / N)^α`` to the losses of models of different sizes.

Kaplan et al. (2020) found that the held-out loss of Transformer language models trained to
convergence on enough data falls as a power law of their size ``N``, counted as **non-embedding
parameters**, "excluding all vocabulary and positional embeddings" (those scale with the
vocabulary and the context, not with the model's capacity to compute)::

    L(N) = (N_c / N)^α_N,      α_N ≈ 0.076,  N_c ≈ 8.8 · 10^13      (Kaplan et al., 2020, eq. 1.1)

A power law is a straight line on log-log axes, ``log L = α log N_c − α log N``, so
:func:`fit_power_law` fits it by least squares on the logarithms: the slope is ``−α``.
:func:`non_embedding_parameters` counts ``N`` for a model the way Kaplan et al. do: every
parameter but the token embedding, the output projection onto the vocabulary (the same matrix
when the two are tied) and the position table. For a GPT block that is about ``12 · d_model²``
per layer (:func:`kaplan_parameter_estimate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from companion._validation import check_int

__all__ = ["PowerLawFit", "fit_power_law", "non_embedding_parameters", "kaplan_parameter_estimate"]


@dataclass(frozen=True)
class PowerLawFit:
    """A fitted ``L(N) = (N_c / N)^α``.

    Attributes:
        alpha: the exponent ``α`` (positive when the loss falls with ``N``).
        n_c: the scale ``N_c`` (the ``N`` at which the fitted loss would be 1).
        r2: coefficient of determination of the straight-line fit in log-log space.
        log_residuals: ``log L − log L̂`` at each point, the fit's misses (log units).
    """

    alpha: float
    n_c: float
    r2: float
    log_residuals: tuple[float, ...]

    def __call__(self, n: float | Tensor) -> float | Tensor:
        """The fitted loss ``(N_c / n)^α`` at size ``n`` (a number or a tensor of sizes)."""
        if isinstance(n, Tensor):
            return torch.exp(self.alpha * (math.log(self.n_c) - n.double().log()))
        if isinstance(n, bool) or not isinstance(n, (int, float)) or not n > 0:
            raise ValueError(f"n must be a positive number or a tensor, got {n!r}")
        return math.exp(self.alpha * (math.log(self.n_c) - math.log(n)))


def _positive_values(name: str, values: object) -> Tensor:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}")
    try:
        t = torch.as_tensor(values, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}") from err
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()) or not bool((t > 0).all()):
        raise ValueError(f"{name} must be finite and > 0 (a power law lives on log-log axes), got {t.tolist()}")
    return t


def fit_power_law(sizes: Sequence[float] | Tensor, losses: Sequence[float] | Tensor) -> PowerLawFit:
    """Least-squares fit of ``L(N) = (N_c / N)^α`` on log-log axes.

    Fits ``log L = a + b log N`` by ordinary least squares; then ``α = −b`` and
    ``N_c = exp(a / α)``.

    Args:
        sizes: ``N`` for each model (non-embedding parameters), positive, at least two distinct.
        losses: the held-out loss of each model (nats per token), positive, same length.

    Returns:
        A :class:`PowerLawFit`; call it to evaluate the fitted law.
    """
    n = _positive_values("sizes", sizes)
    loss = _positive_values("losses", losses)
    if n.numel() != loss.numel():
        raise ValueError(f"sizes and losses must have the same length, got {n.numel()} and {loss.numel()}")
    if n.numel() < 2 or torch.unique(n).numel() < 2:
        raise ValueError("sizes must hold at least two distinct values to fit a line")
    x, y = n.log(), loss.log()
    xc, yc = x - x.mean(), y - y.mean()
    slope = float((xc * yc).sum() / (xc * xc).sum())
    intercept = float(y.mean() - slope * x.mean())
    if slope == 0:
        raise ValueError("the losses do not change with size (slope 0): no power law to fit")
    alpha = -slope
    residuals = y - (intercept + slope * x)
    total = float((yc * yc).sum())
    r2 = 1.0 - float((residuals * residuals).sum()) / total if total > 0 else 1.0
    return PowerLawFit(alpha=alpha, n_c=math.exp(intercept / alpha), r2=r2,
                       log_residuals=tuple(residuals.tolist()))


def non_embedding_parameters(model: nn.Module, embeddings: Sequence[nn.Module] | None = None) -> int:
    """Parameters of ``model`` outside its vocabulary and position embeddings (Kaplan et al.'s ``N``).

    Args:
        model: a model; for a :class:`~companion.models.gpt.GPT` the embeddings are found for you:
            ``tok_emb``, the output projection ``head`` (tied or not) and the learned position
            table, if any.
        embeddings: for other models, the embedding modules to leave out.

    Returns:
        The number of scalar parameters, each shared ``Parameter`` counted once.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if embeddings is None:
        tok = getattr(model, "tok_emb", None)
        if tok is None:
            raise ValueError("model has no tok_emb: pass embeddings= (the embedding modules to leave out)")
        embeddings = [tok]
        head = getattr(model, "head", None)
        if isinstance(head, nn.Module):
            embeddings.append(head)
        table = getattr(getattr(getattr(model, "stack", None), "positions", None), "table", None)
        if table is not None:
            embeddings.append(table)
    for e in embeddings:
        if not isinstance(e, nn.Module):
            raise TypeError(f"embeddings must hold torch.nn.Modules, got {type(e).__name__}")
    excluded = {id(p) for e in embeddings for p in e.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in excluded)


def kaplan_parameter_estimate(n_layers: int, d_model: int) -> int:
    """Kaplan et al.'s estimate of a GPT's non-embedding parameters, ``12 · n_layers · d_model²``.

    Per block: ``4 d²`` in attention (Q, K, V, output) and ``8 d²`` in an FFN of width ``4 d``;
    biases and norms (``O(d)`` per block) are left out.
    """
    check_int("n_layers", n_layers, 1)
    check_int("d_model", d_model, 1)
    return 12 * n_layers * d_model**2
