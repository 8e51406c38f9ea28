"""Training losses: cross-entropy, with label smoothing, and the objectives of the model families.

Cross-entropy against a one-hot target is ``−log p_y``. **Label smoothing** (Szegedy et al.,
2016; used by the Transformer with ε = 0.1) trains against a softened target instead::

    q = (1 − ε) · onehot(y) + ε / V          (V classes; q sums to 1)
    loss = −Σ_v q_v log p_v = (1 − ε) · (−log p_y) + ε · mean_v(−log p_v)

so the model is also penalised for putting all its mass on one class: it stays less confident,
which costs held-out likelihood (perplexity rises) and often helps accuracy and calibration.
:func:`label_smoothed_cross_entropy` writes that formula out; it equals
``F.cross_entropy(logits, targets, label_smoothing=ε)``.

The families' objectives, each a ``(model, batch) -> loss`` callable that
:func:`companion.training.train` accepts: :func:`cross_entropy_loss` (classifiers and language
models given ``(inputs, targets)``), :func:`teacher_forcing_loss` (encoder-decoders).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["label_smoothed_cross_entropy", "cross_entropy_loss", "teacher_forcing_loss"]


def label_smoothed_cross_entropy(logits: Tensor, targets: Tensor, smoothing: float = 0.0,
                                 ignore_index: int = -100) -> Tensor:
    """Mean ``−Σ_v q_v log p_v`` with the smoothed target ``q = (1 − ε)·onehot(y) + ε/V``.

    Args:
        logits: ``(..., V)`` unnormalised scores.
        targets: ``(...)`` class ids; positions equal to ``ignore_index`` do not count.
        smoothing: ε in ``[0, 1)``; 0 is plain cross-entropy.
        ignore_index: the id of positions to skip (padding).

    Returns:
        A scalar: the mean over the counted positions (NaN if there are none, as PyTorch).
    """
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise TypeError(f"logits must be a floating-point tensor (..., V), got {getattr(logits, 'dtype', logits)}")
    if not isinstance(targets, Tensor) or targets.shape != logits.shape[:-1]:
        got = tuple(targets.shape) if isinstance(targets, Tensor) else type(targets).__name__
        raise ValueError(f"targets must have shape {tuple(logits.shape[:-1])} (logits without the class dim), "
                         f"got {got}")
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
        raise ValueError(f"smoothing must be a number in [0, 1), got {smoothing!r}")
    log_p = logits.float().log_softmax(-1).flatten(0, -2)  # (positions, V)
    targets = targets.flatten()
    keep = targets != ignore_index
    log_p, targets = log_p[keep], targets[keep]
    n_classes = log_p.shape[-1]
    q = torch.full_like(log_p, smoothing / n_classes)
    q.scatter_add_(-1, targets[:, None], torch.full_like(log_p[:, :1], 1 - smoothing))
    return -(q * log_p).sum(-1).mean()


def cross_entropy_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """Mean cross-entropy of ``model(inputs)`` against integer ``targets``.

    ``batch`` is ``(inputs, targets)``; logits of shape ``(..., n_classes)`` are compared with
    targets of shape ``(...)``, so it serves classifiers ``(batch,)`` and language models
    ``(batch, seq)`` alike.
    """
    inputs, targets = batch
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def teacher_forcing_loss(model: nn.Module, batch: tuple[Tensor, Tensor], label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy of an encoder-decoder's ``model(src, tgt[:, :-1])`` against ``tgt[:, 1:]``, ignoring padding.

    ``batch`` is ``(src (batch, src_len), tgt (batch, tgt_len))`` with ``tgt = <bos> y <eos> <pad>…``.
    The decoder input is the target shifted right by one, so position ``t`` predicts token
    ``t + 1`` having seen the true tokens ``0..t``. ``model.pad_id`` marks the padding.
    ``label_smoothing``: 0.1 in the Transformer paper.
    """
    src, tgt = batch
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt[:, 1:].reshape(-1),
                           ignore_index=model.pad_id, label_smoothing=label_smoothing)
