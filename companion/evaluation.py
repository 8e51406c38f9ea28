"""Statistics of generated text: how diverse it is, how much it repeats, how likely the model finds it.

A decoding strategy (greedy, temperature, top-k, top-p: :mod:`companion.generation`) is judged by
the text it produces. Three numbers describe that text, each computed on token ids:

* :func:`distinct_n` — the share of distinct n-grams among all n-grams of a set of samples
  (Li et al., 2016): 1 when no n-gram occurs twice, near 0 when the samples say the same thing
  over and over.
* :func:`repeat_rate` — within one sample, the share of its n-grams that already occurred earlier
  in it, averaged over samples (``seq-rep-n`` of Welleck et al., 2020): the signature of the
  loops greedy decoding falls into (Holtzman et al., 2020).
* :func:`continuation_nll` — the mean negative log-likelihood (nats per token) a model assigns
  to the tokens after a prompt, teacher-forced in one forward pass. On held-out human text it is
  the model's loss; on the model's own samples it says whether a strategy stays where the model
  is confident (greedy: far below the loss on human text) or wanders into its unreliable tail
  (pure sampling; Holtzman et al., 2020, Table 1).

:func:`stream_nll` is the held-out loss of a long token stream for a model with a fixed context:
every token scored once, from windows that overlap so that each prediction has at least
``context - stride`` tokens of context (a sliding-window evaluation; Dai et al., 2019, Fig. 1,
draw its extreme case, stride 1, for a fixed-context Transformer).

:func:`bits_per_character` converts a loss in nats per token into bits per character, the unit
in which models with different tokenizers can be compared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import check_int

__all__ = ["distinct_n", "repeat_rate", "continuation_nll", "stream_nll", "bits_per_character"]

Sequences = Tensor | Sequence[Sequence[int]]


def _as_lists(name: str, sequences: object) -> list[list[int]]:
    """``sequences`` as a list of lists of ints: a 2-D integer tensor or a sequence of int sequences."""
    if isinstance(sequences, Tensor):
        if sequences.dim() != 2 or sequences.is_floating_point() or sequences.dtype == torch.bool:
            raise ValueError(f"{name} must be a 2-D integer tensor (n_samples, length) or a list of id lists, "
                             f"got shape {tuple(sequences.shape)}, dtype {sequences.dtype}")
        return sequences.tolist()
    if isinstance(sequences, (str, bytes)) or not isinstance(sequences, Sequence):
        raise TypeError(f"{name} must be a 2-D integer tensor or a list of id lists, got {type(sequences).__name__}")
    rows = []
    for row in sequences:
        row = row.tolist() if isinstance(row, Tensor) else row
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in row):
            raise TypeError(f"{name} must hold sequences of int token ids, got {row!r:.60}")
        rows.append(list(row))
    return rows


def _ngrams(row: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(row[i : i + n]) for i in range(len(row) - n + 1)]


def distinct_n(sequences: Sequences, n: int = 2) -> float:
    """Distinct n-grams / all n-grams, pooled over ``sequences`` (Li et al., 2016).

    Args:
        sequences: samples of token ids, a ``(n_samples, length)`` integer tensor or a list of id
            lists (lengths may differ); pass only the generated part, not the prompt.
        n: the n-gram order (1: distinct tokens).

    Returns:
        A number in ``(0, 1]``: 1 when every n-gram is new.
    """
    check_int("n", n, 1)
    grams = [g for row in _as_lists("sequences", sequences) for g in _ngrams(row, n)]
    if not grams:
        raise ValueError(f"sequences hold no {n}-gram: every sample is shorter than n={n}")
    return len(set(grams)) / len(grams)


def repeat_rate(sequences: Sequences, n: int = 4) -> float:
    """Share of each sample's n-grams that repeat an earlier one in the same sample, averaged over samples.

    For one sample ``x``: ``1 − |distinct n-grams of x| / |n-grams of x|`` (``seq-rep-n``,
    Welleck et al., 2020). 0 for a sample without repeated n-grams; close to 1 for a loop.

    Args:
        sequences: as :func:`distinct_n`; samples shorter than ``n`` are skipped.
        n: the n-gram order (4, as Welleck et al.).
    """
    check_int("n", n, 1)
    rates = []
    for row in _as_lists("sequences", sequences):
        grams = _ngrams(row, n)
        if grams:
            rates.append(1 - len(set(grams)) / len(grams))
    if not rates:
        raise ValueError(f"sequences hold no {n}-gram: every sample is shorter than n={n}")
    return sum(rates) / len(rates)


@torch.no_grad()
def continuation_nll(model: nn.Module, ids: Tensor, prompt_len: int) -> Tensor:
    """Mean ``−log p(x_t | x_<t)`` (nats per token) of ``ids[:, prompt_len:]`` under ``model``, per sequence.

    One teacher-forced forward pass: position ``t − 1``'s logits score token ``t``. The model
    runs in eval mode (its mode is restored afterwards).

    Args:
        model: a causal language model, ``ids (batch, seq) -> logits (batch, seq, vocab)``
            (:class:`~companion.models.gpt.GPT`).
        ids: ``(batch, seq)`` token ids: a prompt of ``prompt_len`` tokens, then the continuation.
        prompt_len: tokens of context before the scored ones, ``1 <= prompt_len < seq``.

    Returns:
        ``(batch,)`` float tensor: the mean negative log-likelihood of each continuation.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
        got = f"shape {tuple(ids.shape)}, dtype {ids.dtype}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"ids must be an integer tensor of shape (batch, seq), got {got}")
    check_int("prompt_len", prompt_len, 1)
    if prompt_len >= ids.shape[1]:
        raise ValueError(f"prompt_len must be < seq = {ids.shape[1]} (at least one token to score), got {prompt_len}")
    was_training = model.training
    model.eval()
    try:
        logits = model(ids)
    finally:
        model.train(was_training)
    if not isinstance(logits, Tensor) or logits.shape[:2] != ids.shape:
        raise ValueError(f"model(ids) must return logits (batch, seq, vocab) = {tuple(ids.shape)} + (vocab,), "
                         f"got {getattr(logits, 'shape', type(logits).__name__)}")
    scored = logits[:, prompt_len - 1 : -1].float()  # (batch, n_scored, vocab): predicts ids[:, prompt_len:]
    targets = ids[:, prompt_len:]
    nll = F.cross_entropy(scored.transpose(1, 2), targets, reduction="none")  # (batch, n_scored)
    return nll.mean(dim=1)


@torch.no_grad()
def stream_nll(model: nn.Module, ids: Tensor, context: int, stride: int | None = None, batch_size: int = 64) -> float:
    """Mean ``−log p(x_t | window)`` (nats per token) over every token ``t >= 1`` of a stream ``ids`` ``(n,)``.

    The model reads windows of ``context`` tokens starting every ``stride`` tokens (the last one
    aligned with the end of the stream). The first window scores all its predictions; each later
    one scores only the tokens no earlier window scored, so every token from the second on is
    scored exactly once, and (beyond the first window) from at least ``context - stride`` tokens
    of context. ``stride = context`` (the default) is non-overlapping windows: the cheapest, but
    the first tokens of each window are predicted from almost nothing. ``stride = context // 2``
    costs twice as many forward passes and gives every prediction at least half a window.

    Args:
        model: a causal language model, ``ids (batch, seq) -> logits (batch, seq, vocab)``, run in
            eval mode (its mode is restored afterwards).
        ids: ``(n,)`` token ids, ``n >= 2``, on the model's device.
        context: tokens per window (at most the model's ``max_len``).
        stride: tokens between window starts, ``1 <= stride <= context``.
        batch_size: windows per forward pass.

    Returns:
        The mean negative log-likelihood over the ``n - 1`` predicted tokens.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if (not isinstance(ids, Tensor) or ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool
            or len(ids) < 2):
        got = f"shape {tuple(ids.shape)}, dtype {ids.dtype}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"ids must be a 1-D integer tensor of at least 2 token ids, got {got}")
    check_int("context", context, 1)
    stride = context if stride is None else stride
    check_int("stride", stride, 1)
    if stride > context:
        raise ValueError(f"stride must be <= context = {context} (a larger stride would skip tokens), got {stride}")
    check_int("batch_size", batch_size, 1)
    n = len(ids)
    width = min(context, n - 1)  # a stream shorter than a window is one window
    starts = list(range(0, n - 1 - width + 1, stride))
    if starts[-1] + width < n - 1:
        starts.append(n - 1 - width)  # the last window ends with the stream
    skips, scored_up_to = [], 0  # scored_up_to: targets 1..scored_up_to are done
    for s in starts:
        skips.append(scored_up_to - s)  # the window's first targets (s+1 ..) that an earlier one scored
        scored_up_to = s + width
    was_training = model.training
    model.eval()
    total = 0.0
    try:
        offsets = torch.arange(width, device=ids.device)
        for i in range(0, len(starts), batch_size):
            first = torch.tensor(starts[i : i + batch_size], device=ids.device)[:, None]
            x, y = ids[first + offsets], ids[first + offsets + 1]  # (windows, width)
            nll = F.cross_entropy(model(x).float().transpose(1, 2), y, reduction="none")
            keep = offsets >= torch.tensor(skips[i : i + batch_size], device=ids.device)[:, None]
            total += nll[keep].sum().item()
    finally:
        model.train(was_training)
    return total / (n - 1)


def bits_per_character(nats_per_token: float, n_tokens: int, n_chars: int) -> float:
    """A loss in nats per token as bits per character: ``nats · n_tokens / (n_chars · ln 2)``.

    ``n_tokens`` and ``n_chars`` describe the same text (its length in tokens and in characters),
    so ``n_tokens / n_chars`` is the tokenizer's tokens per character on it.
    """
    if isinstance(nats_per_token, bool) or not isinstance(nats_per_token, (int, float)) or not (
            0 <= nats_per_token < math.inf):
        raise ValueError(f"nats_per_token must be a finite number >= 0, got {nats_per_token!r}")
    check_int("n_tokens", n_tokens, 1)
    check_int("n_chars", n_chars, 1)
    return nats_per_token * n_tokens / (n_chars * math.log(2))
