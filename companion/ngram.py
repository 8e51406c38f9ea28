"""Count-based n-gram language models: the baseline every neural language model must beat.

A language model's held-out loss means little on its own; next to the loss of a table of counts
on the same split it says how much of the text's structure the model has learned. An n-gram model
predicts token ``w`` from the ``n − 1`` tokens before it, ``h``, by counting how often ``h w``
followed ``h`` in the training text (Jurafsky & Martin, ch. 3). Unseen pairs must not get
probability zero (a held-out loss would be infinite). Two smoothings are implemented:

* ``smoothing="absolute"`` (the default), **interpolated absolute discounting**: every seen count
  gives up a discount ``D`` and the freed mass goes to the lower-order model::

      P_n(w | h) = max(c(h w) − D, 0) / c(h)  +  D · N₁₊(h •) / c(h) · P_{n−1}(w | h')

  where ``c(h) = Σ_w c(h w)``, ``N₁₊(h •)`` is the number of distinct tokens seen after ``h``,
  ``h'`` is ``h`` without its first token, and a context never seen in training falls back to
  ``P_{n−1}`` entirely. The recursion ends at the add-one unigram ``(c(w) + 1) / (N + V)``.
* ``smoothing="kneser_ney"``, **interpolated Kneser–Ney** (Kneser & Ney, 1995; the interpolated
  form of Chen & Goodman, 1999, with one discount): the same recursion, but every *lower* order
  counts the distinct tokens that precede a k-gram, ``N₁₊(• h w)``, instead of its occurrences,
  so a token that is frequent only after one context (*Francisco* after *San*) gets little mass
  where that context is absent. The unigram level is discounted the same way and interpolated with
  the uniform ``1 / V``. The highest order keeps the plain counts.

Every conditional distribution sums to 1 over the vocabulary (tested, and both smoothings are
checked against a brute-force model written with ``Counter``).

:func:`ngram_cross_entropy` is the one-call form the chapters use: fit on the training ids,
return the mean negative log-likelihood (nats per token) of the held-out ids.
:meth:`NGramLM.window_nll` scores the predictions a neural model makes on windows of text, so
the two are compared over the same positions with the same context.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from companion._validation import check_choice, check_int

__all__ = ["NGramLM", "ngram_cross_entropy"]


def _as_ids(name: str, ids: Tensor | Sequence[int], vocab_size: int) -> Tensor:
    ids = torch.as_tensor(ids)
    if ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be a 1-D sequence of integer token ids, got shape {tuple(ids.shape)}, "
                         f"dtype {ids.dtype}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{name} must lie in [0, {vocab_size}), got min {int(ids.min())}, max {int(ids.max())}")
    return ids.long().cpu()


def _keys(ids: Tensor, k: int, vocab_size: int) -> Tensor:
    """The ``k``-grams of ``ids`` as single int64 numbers (base ``vocab_size``), ``(len(ids) − k + 1,)``."""
    windows = ids.unfold(0, k, 1)  # (positions, k)
    powers = vocab_size ** torch.arange(k - 1, -1, -1, dtype=torch.long)
    return windows @ powers


class _Table:
    """Sorted unique keys with counts, and a vectorised lookup (0 for a key never seen)."""

    def __init__(self, keys: Tensor) -> None:
        self.keys, self.counts = torch.unique(keys, return_counts=True)

    def __call__(self, query: Tensor) -> Tensor:
        if self.keys.numel() == 0:
            return torch.zeros_like(query)
        i = torch.searchsorted(self.keys, query).clamp(max=self.keys.numel() - 1)
        return torch.where(self.keys[i] == query, self.counts[i], torch.zeros_like(query))


SMOOTHINGS = ("absolute", "kneser_ney")


class NGramLM:
    """An ``order``-gram model with interpolated absolute discounting or Kneser–Ney (module docstring).

    Args:
        train_ids: the training token ids, 1-D.
        order: ``n`` (1 = unigram, 2 = bigram, …).
        vocab_size: ids are in ``[0, vocab_size)``; ``vocab_size ** order`` must fit in int64.
        discount: ``D`` in ``(0, 1)``; 0.75 is the usual choice.
        smoothing: ``"absolute"`` or ``"kneser_ney"``.
    """

    def __init__(self, train_ids: Tensor | Sequence[int], order: int, vocab_size: int, discount: float = 0.75,
                 smoothing: str = "absolute") -> None:
        self.order = check_int("order", order, 1)
        self.vocab_size = check_int("vocab_size", vocab_size, 1)
        if isinstance(discount, bool) or not isinstance(discount, (int, float)) or not 0 < discount < 1:
            raise ValueError(f"discount must be a number in (0, 1), got {discount!r}")
        self.smoothing = check_choice("smoothing", smoothing, SMOOTHINGS)
        if order * math.log2(vocab_size) >= 62:
            raise ValueError(f"vocab_size ** order must fit in int64: {vocab_size} ** {order} is too large")
        ids = _as_ids("train_ids", train_ids, vocab_size)
        if ids.numel() < order:
            raise ValueError(f"train_ids must hold at least order={order} tokens, got {ids.numel()}")
        self._train_ids = ids  # kept for the lower-order models window_nll fits near a window's start
        self._lower: dict[int, NGramLM] = {}
        self.discount = float(discount)
        self.n_tokens = ids.numel()
        kn = self.smoothing == "kneser_ney"

        def counted(k: int) -> Tensor:
            # the k-grams, each repeated as often as it counts: its occurrences (absolute discounting,
            # and Kneser-Ney's highest order) or the distinct tokens before it (Kneser-Ney's lower orders)
            if kn and k < order:
                return torch.unique(_keys(ids, k + 1, vocab_size)) % vocab_size**k
            return _keys(ids, k, vocab_size)

        self.unigram = torch.bincount(counted(1), minlength=vocab_size)
        # For each order k >= 2: counts of k-grams, of their (k-1)-token contexts, and of the
        # number of distinct tokens that follow each context.
        self.grams: list[tuple[_Table, _Table, _Table]] = []
        for k in range(2, order + 1):
            grams = counted(k)
            unique_grams = torch.unique(grams)
            contexts = _Table(grams // vocab_size)  # c(h): occurrences of h followed by a token
            followers = _Table(unique_grams // vocab_size)  # N1+(h .): distinct tokens after h
            self.grams.append((_Table(grams), contexts, followers))

    def __repr__(self) -> str:
        return (f"NGramLM(order={self.order}, vocab_size={self.vocab_size}, discount={self.discount}, "
                f"smoothing={self.smoothing!r})")

    def _unigram_prob(self, tokens: Tensor) -> Tensor:
        counts = self.unigram.double()
        if self.smoothing == "absolute":  # add-one
            return (counts[tokens] + 1) / (self.n_tokens + self.vocab_size)
        total, types = counts.sum(), (counts > 0).sum()  # Kneser-Ney: discounted, interpolated with 1/V
        return (counts[tokens] - self.discount).clamp(min=0) / total + self.discount * types / total / self.vocab_size

    def prob(self, contexts: Tensor, tokens: Tensor) -> Tensor:
        """``P(token | context)`` per row: ``contexts`` ``(m, order − 1)``, ``tokens`` ``(m,)`` -> ``(m,)`` float64."""
        contexts = torch.as_tensor(contexts, dtype=torch.long).reshape(len(tokens), self.order - 1)
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        p = self._unigram_prob(tokens)
        for k, (grams, ctx_count, followers) in enumerate(self.grams, start=2):
            h = contexts[:, self.order - k :]  # the last k - 1 tokens of the context
            h_key = h @ (self.vocab_size ** torch.arange(k - 2, -1, -1, dtype=torch.long))
            c_h = ctx_count(h_key).double()
            c_hw = grams(h_key * self.vocab_size + tokens).double()
            n1 = followers(h_key).double()
            seen = c_h > 0
            denom = c_h.clamp(min=1)
            interpolated = (c_hw - self.discount).clamp(min=0) / denom + self.discount * n1 / denom * p
            p = torch.where(seen, interpolated, p)
        return p

    def cross_entropy(self, ids: Tensor | Sequence[int]) -> float:
        """Mean ``−log P(w_t | w_{t−n+1} … w_{t−1})`` over the positions of ``ids`` with a full context (nats)."""
        ids = _as_ids("ids", ids, self.vocab_size)
        if ids.numel() <= self.order - 1:
            raise ValueError(f"ids must hold more than order - 1 = {self.order - 1} tokens, got {ids.numel()}")
        windows = ids.unfold(0, self.order, 1)
        return float(-self.prob(windows[:, :-1], windows[:, -1]).log().mean())

    def window_nll(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """``−log P`` of each next-token prediction a language model makes on windows of text.

        A model fed ``inputs`` predicts ``targets[:, t]`` having seen ``inputs[:, : t + 1]`` only, so
        the n-gram's context is cut at the window's start as well: position ``t`` is scored by the
        ``k``-gram model with ``k = min(order, t + 2)`` fitted on the same training ids (a separate
        model per lower order, fitted once and kept), from the ``k − 1`` inputs before it. Scoring
        the n-gram with context from before the window would give it information the model lacks.

        Args:
            inputs: ``(windows, seq)`` token ids; ``targets[:, t]`` follows ``inputs[:, t]``, as in
                :func:`companion.data.lm_batch` (``targets[:, :-1] == inputs[:, 1:]``).
            targets: ``(windows, seq)`` token ids.

        Returns:
            ``(windows, seq)`` float64 negative log-likelihoods (nats), on the CPU; ``.mean()`` is
            the baseline for the model's mean loss over the same windows.
        """
        inputs, targets = torch.as_tensor(inputs), torch.as_tensor(targets)
        if inputs.dim() != 2 or inputs.shape != targets.shape:
            raise ValueError(f"inputs and targets must be (windows, seq) of one shape, got {tuple(inputs.shape)} "
                             f"and {tuple(targets.shape)}")
        for name, ids in (("inputs", inputs), ("targets", targets)):
            _as_ids(name, ids.reshape(-1), self.vocab_size)
        inputs, targets = inputs.long().cpu(), targets.long().cpu()
        nll = torch.empty(targets.shape, dtype=torch.float64)
        for t in range(targets.shape[1]):
            k = min(self.order, t + 2)  # the highest order this much context allows
            nll[:, t] = -self._model(k).prob(inputs[:, t + 2 - k : t + 1], targets[:, t]).log()
        return nll

    def _model(self, order: int) -> NGramLM:
        """This model (``order == self.order``) or a model of a lower order on the same ids and settings."""
        if order == self.order:
            return self
        if order not in self._lower:
            self._lower[order] = NGramLM(self._train_ids, order, self.vocab_size, self.discount, self.smoothing)
        return self._lower[order]


def ngram_cross_entropy(train_ids: Tensor | Sequence[int], eval_ids: Tensor | Sequence[int], order: int,
                        vocab_size: int, discount: float = 0.75, smoothing: str = "absolute") -> float:
    """Held-out loss (nats per token) of an :class:`NGramLM` fitted on ``train_ids``, evaluated on ``eval_ids``."""
    return NGramLM(train_ids, order, vocab_size, discount, smoothing).cross_entropy(eval_ids)
