"""Static word embeddings: skip-gram word2vec with negative sampling (Mikolov et al., 2013a, 2013b).

Skip-gram models the probability of a context word :math:`c` near a centre word :math:`w` with a
softmax over the whole vocabulary (Mikolov et al., 2013b, eq. 2),

.. math:: p(c \\mid w) = \\frac{\\exp(u_c^\\top v_w)}{\\sum_{j=1}^{V} \\exp(u_j^\\top v_w)},

whose loss and gradient touch all :math:`V` output vectors for every pair: :math:`O(Vd)` work
(:meth:`SkipGram.softmax_loss`). Negative sampling replaces it with a cheaper proxy task: from a
centre word :math:`w`, tell the words really seen around it (within a window) from ``negatives``
words drawn at random from the unigram distribution raised to 3/4. Each word has an input vector
:math:`v_w` (the embedding we keep) and an output vector :math:`u_w`; the loss for one
(centre, context) pair with negatives :math:`n_1..n_K` is (Mikolov et al., 2013b, eq. 4), at
:math:`O(Kd)` cost,

.. math:: -\\log\\sigma(u_{c}^\\top v_w) - \\sum_{k=1}^{K} \\log\\sigma(-u_{n_k}^\\top v_w).

Frequent words are subsampled (eq. 5): each occurrence of a word of relative frequency
:math:`f` is kept with probability :math:`\\min(1, \\sqrt{t / f})`.

:class:`Word2Vec` trains the vectors and answers :meth:`~Word2Vec.nearest`,
:meth:`~Word2Vec.most_similar` (with :meth:`~Word2Vec.rank`) and :meth:`~Word2Vec.analogy` queries by
cosine similarity.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from companion._validation import check_int, check_positive_float
from companion.tokenization import split_words
from companion.utils import get_device
from companion.utils import progress as progress_bar

__all__ = [
    "corpus_words",
    "build_vocab",
    "keep_probabilities",
    "noise_distribution",
    "skipgram_pairs",
    "SkipGram",
    "Word2Vec",
]


def corpus_words(text: str, drop_speaker_lines: bool = True) -> list[str]:
    """The lowercased alphabetic words of ``text`` (punctuation and numbers dropped).

    With ``drop_speaker_lines``, lines such as ``KING LEAR:`` (a speaker's name in the plays of
    :mod:`companion.data`) are removed first: they are labels, not speech, and would make
    "king" a neighbour of every name.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if drop_speaker_lines:
        text = "\n".join(
            line for line in text.splitlines() if not (line.endswith(":") and line.upper() == line)
        )
    return [w for w in split_words(text, lowercase=True) if w.isalpha()]


def build_vocab(words: Sequence[str], min_count: int = 5) -> tuple[list[str], torch.Tensor]:
    """The words seen at least ``min_count`` times, most frequent first (ties alphabetical).

    Returns:
        ``(itos, counts)``: the words, and their counts as a ``(vocab,)`` int64 tensor.
    """
    check_int("min_count", min_count, 1)
    counts = Counter(words)
    itos = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    if not itos:
        raise ValueError(f"no word occurs at least min_count={min_count} times")
    return itos, torch.tensor([counts[w] for w in itos], dtype=torch.long)


def keep_probabilities(counts: torch.Tensor, threshold: float = 1e-4) -> torch.Tensor:
    """Probability of keeping each occurrence of each word in subsampling: ``min(1, sqrt(t / f))``.

    Args:
        counts: ``(vocab,)`` word counts.
        threshold: ``t``; words with relative frequency ``f <= t`` are always kept.

    Returns:
        ``(vocab,)`` float tensor in ``(0, 1]``.
    """
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0, got {threshold!r}")
    freq = counts.double() / counts.sum()
    return torch.sqrt(threshold / freq).clamp(max=1.0).float()


def noise_distribution(counts: torch.Tensor, power: float = 0.75) -> torch.Tensor:
    """The negative-sampling distribution ``counts ** power``, normalised: ``(vocab,)`` floats.

    The 3/4 power flattens the unigram distribution, so rare words are drawn more often than
    their frequency alone would give (Mikolov et al., 2013b).
    """
    weights = counts.double() ** power
    return (weights / weights.sum()).float()


def skipgram_pairs(
    ids: torch.Tensor, window: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """All (centre, context) pairs of a token stream, with word2vec's shrunk windows.

    Each position draws its own window radius uniformly in ``1..window`` (so near words are
    paired more often than far ones) and is paired with every word within that radius.

    Args:
        ids: ``(n,)`` word ids.
        window: the largest radius.

    Returns:
        ``(centres, contexts)``, two ``(pairs,)`` int64 tensors on the device of ``ids``.
    """
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D (n,), got shape {tuple(ids.shape)}")
    check_int("window", window, 1)
    n = len(ids)
    radius = torch.randint(1, window + 1, (n,), generator=generator).to(ids.device)
    centres, contexts = [], []
    for offset in range(1, min(window, n - 1) + 1):
        left = torch.arange(n - offset, device=ids.device)
        right = left + offset
        # The pair (left, right) is seen from the left word if its radius reaches, and vice versa.
        from_left = left[radius[left] >= offset]
        from_right = right[radius[right] >= offset]
        centres += [ids[from_left], ids[from_right]]
        contexts += [ids[from_left + offset], ids[from_right - offset]]
    if not centres:
        empty = ids.new_empty(0)
        return empty, empty
    return torch.cat(centres), torch.cat(contexts)


@contextlib.contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` PyTorch CPU threads (``None``: unchanged), then restore the count."""
    saved = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _check_pairs(centres: torch.Tensor, contexts: torch.Tensor) -> None:
    if not isinstance(centres, torch.Tensor) or not isinstance(contexts, torch.Tensor):
        raise TypeError(f"centres and contexts must be torch.Tensor, got {type(centres).__name__} "
                        f"and {type(contexts).__name__}")
    if centres.dim() != 1 or contexts.shape != centres.shape:
        raise ValueError(
            f"centres and contexts must be 1-D of the same shape, got {tuple(centres.shape)} "
            f"and {tuple(contexts.shape)}"
        )


class SkipGram(nn.Module):
    """Skip-gram: two embedding tables, with the negative-sampling loss (:meth:`forward`, what
    word2vec trains) and the full-softmax loss it replaces (:meth:`softmax_loss`).

    Args:
        vocab_size: number of words ``V``.
        dim: embedding size ``d``.

    Attributes:
        input: ``(V, d)`` embedding of centre words, the vectors kept after training; initialised
            uniformly in ``[-0.5/d, 0.5/d]`` as in word2vec.
        output: ``(V, d)`` embedding of context words, initialised to zero.
    """

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        if vocab_size < 1 or dim < 1:
            raise ValueError(f"vocab_size and dim must be >= 1, got {vocab_size} and {dim}")
        self.input = nn.Embedding(vocab_size, dim)
        self.output = nn.Embedding(vocab_size, dim)
        nn.init.uniform_(self.input.weight, -0.5 / dim, 0.5 / dim)
        nn.init.zeros_(self.output.weight)

    def forward(self, centres: torch.Tensor, contexts: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        """Mean negative-sampling loss (eq. 4 of Mikolov et al., 2013b) over a batch.

        Args:
            centres: ``(batch,)`` centre word ids.
            contexts: ``(batch,)`` ids of words seen near them.
            negatives: ``(batch, K)`` ids drawn from the noise distribution.

        Returns:
            A scalar: ``-log σ(u_c·v_w) - Σ_k log σ(-u_{n_k}·v_w)``, averaged over the batch.
        """
        _check_pairs(centres, contexts)
        if negatives.dim() != 2 or negatives.shape[0] != centres.shape[0]:
            raise ValueError(f"negatives must be (batch, K) with batch={len(centres)}, got {tuple(negatives.shape)}")
        v = self.input(centres)  # (batch, d)
        u = self.output(torch.cat([contexts[:, None], negatives], dim=1))  # (batch, 1 + K, d)
        # Row-wise dot products. (A batched matmul of (1+K, d) by (d, 1) blocks is slower on CPU.)
        scores = (u * v.unsqueeze(1)).sum(-1)  # (batch, 1 + K)
        labels = torch.zeros_like(scores)
        labels[:, 0] = 1.0  # the true context is a positive, the K negatives are not
        # -log σ(s) for the positive and -log σ(-s) for negatives is exactly BCE with logits.
        return F.binary_cross_entropy_with_logits(scores, labels, reduction="sum") / len(centres)

    def softmax_loss(self, centres: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
        """Mean full-softmax skip-gram loss (eq. 2 of Mikolov et al., 2013b) over a batch.

        ``-log p(c | w)`` with ``p(c | w) = exp(u_c·v_w) / Σ_j exp(u_j·v_w)``, the sum running over
        all ``V`` words: the scores are a ``(batch, d) @ (d, V)`` product, so each pair costs
        ``O(V d)`` and its gradient reaches every row of :attr:`output`. The negative-sampling
        loss of :meth:`forward` is the cheap replacement word2vec trains with.

        Args:
            centres: ``(batch,)`` centre word ids.
            contexts: ``(batch,)`` ids of words seen near them.

        Returns:
            A scalar: ``-log p(c | w)`` averaged over the batch.
        """
        _check_pairs(centres, contexts)
        scores = self.input(centres) @ self.output.weight.T  # (batch, V)
        return F.cross_entropy(scores, contexts)


class Word2Vec:
    """Trained word vectors with cosine-similarity queries.

    Args:
        itos: the words, in id order.
        vectors: ``(V, d)`` float tensor, row ``i`` the vector of ``itos[i]``.
        counts: ``(V,)`` training counts, or ``None``.
        context_vectors: ``(V, d)`` output vectors :math:`u_w` (:attr:`SkipGram.output`), or ``None``.
    """

    def __init__(self, itos: Sequence[str], vectors: torch.Tensor, counts: torch.Tensor | None = None,
                 context_vectors: torch.Tensor | None = None):
        if vectors.dim() != 2 or vectors.shape[0] != len(itos):
            raise ValueError(f"vectors must be (len(itos)={len(itos)}, d), got {tuple(vectors.shape)}")
        if context_vectors is not None and context_vectors.shape != vectors.shape:
            raise ValueError(f"context_vectors must have the shape of vectors {tuple(vectors.shape)}, "
                             f"got {tuple(context_vectors.shape)}")
        if len(set(itos)) != len(itos):
            raise ValueError("itos must hold distinct words")
        self.itos = list(itos)
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        self.vectors = vectors.detach()
        self.counts = counts
        self.context_vectors = None if context_vectors is None else context_vectors.detach()
        self._unit = F.normalize(self.vectors.float(), dim=1)

    @classmethod
    def train(
        cls,
        words: Sequence[str],
        dim: int = 100,
        window: int = 5,
        negatives: int = 5,
        min_count: int = 5,
        subsample: float = 1e-4,
        epochs: int = 2,
        batch_size: int = 8192,
        lr: float = 0.02,
        seed: int = 0,
        device: torch.device | str | None = None,
        cpu_threads: int | None = 1,
        progress: bool = False,
    ) -> Word2Vec:
        """Train skip-gram with negative sampling on a list of words.

        Per epoch: subsample the frequent words (:func:`keep_probabilities`), make the
        (centre, context) pairs (:func:`skipgram_pairs`), shuffle them, draw ``negatives`` noise
        words per pair (:func:`noise_distribution`) and take Adam steps on the mean loss of
        :class:`SkipGram` over batches of ``batch_size`` pairs, with the learning rate decaying
        linearly from ``lr`` to zero over the run (as in word2vec).

        The gradients of the two embedding tables are dense, as PyTorch makes them by default, and
        Adam updates every row: besides the ``O((K + 2) d)`` work per pair of the loss, each step
        costs ``O(V d)``, spread over the ``batch_size`` pairs of the batch (about 130 numbers
        per pair for ``V = 8,496``, ``d = 64`` and 8,192 pairs). Word2vec's C code instead updates
        only the rows a pair touches; with ``nn.Embedding(..., sparse=True)`` and
        ``torch.optim.SparseAdam`` PyTorch can do the same.

        Args:
            words: the corpus as a sequence of words (e.g. :func:`corpus_words`).
            dim, window, negatives: vector size, largest context radius, noise words per pair.
            min_count: words seen fewer times are dropped before training.
            subsample: the threshold ``t`` of :func:`keep_probabilities`.
            device: where to train (default :func:`companion.utils.get_device`).
            cpu_threads: PyTorch CPU threads while training (restored afterwards); ``None`` keeps
                the current setting. One is the default: each step is a few small gathers and
                scatters, where extra threads mostly wait on each other.

        Returns:
            The trained :class:`Word2Vec` (vectors on the CPU), with the output vectors as
            ``context_vectors``.
        """
        if isinstance(words, str) or not isinstance(words, Sequence):
            raise TypeError(f"words must be a sequence of str (e.g. a list), got {type(words).__name__}")
        for name, value in (("dim", dim), ("window", window), ("negatives", negatives), ("min_count", min_count),
                            ("epochs", epochs), ("batch_size", batch_size)):
            check_int(name, value, 1)
        check_positive_float("subsample", subsample)
        check_positive_float("lr", lr)
        if cpu_threads is not None and (
            isinstance(cpu_threads, bool) or not isinstance(cpu_threads, int) or cpu_threads < 1
        ):
            raise ValueError(f"cpu_threads must be None or an int >= 1, got {cpu_threads!r}")
        device = get_device(device)
        with _torch_threads(cpu_threads):
            return cls._train(words, dim, window, negatives, min_count, subsample, epochs, batch_size, lr, seed,
                              device, progress)

    @classmethod
    def _train(cls, words, dim, window, negatives, min_count, subsample, epochs, batch_size, lr, seed, device,
               progress) -> Word2Vec:
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # the parameter initialisation
        itos, counts = build_vocab(words, min_count)
        stoi = {w: i for i, w in enumerate(itos)}
        ids = torch.tensor([stoi[w] for w in words if w in stoi], dtype=torch.long)
        keep = keep_probabilities(counts, subsample)
        noise = noise_distribution(counts)

        model = SkipGram(len(itos), dim).to(device)
        # The fused kernel updates all parameters in one pass: a third of the step time on CPU.
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=device.type in ("cpu", "cuda"))
        step, total_steps = 0, None
        for epoch in range(epochs):
            kept = ids[torch.rand(len(ids), generator=generator) < keep[ids]]
            centres, contexts = skipgram_pairs(kept, window, generator)
            if len(centres) == 0:
                continue
            order = torch.randperm(len(centres), generator=generator)
            centres, contexts = centres[order], contexts[order]
            noise_ids = torch.multinomial(noise, len(centres) * negatives, replacement=True, generator=generator)
            # One transfer per epoch rather than three per step.
            centres, contexts = centres.to(device), contexts.to(device)
            noise_ids = noise_ids.view(-1, negatives).to(device)
            n_batches = math.ceil(len(centres) / batch_size)
            if total_steps is None:  # epochs have about the same number of pairs
                total_steps = n_batches * epochs
            bar = progress_bar(range(n_batches), enabled=progress, desc=f"word2vec epoch {epoch + 1}/{epochs}",
                               leave=False, mininterval=0.5)
            for b in bar:
                batch = slice(b * batch_size, (b + 1) * batch_size)
                # Linear decay of the learning rate to zero, as word2vec does.
                for group in optimizer.param_groups:
                    group["lr"] = lr * max(0.0, 1.0 - step / total_steps)
                step += 1
                loss = model(centres[batch], contexts[batch], noise_ids[batch])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if b % 50 == 0:
                    bar.set_postfix(loss=f"{loss.item():.3f}")
        if step == 0:
            raise ValueError(
                f"no training pairs: after min_count={min_count} and subsample={subsample}, no two words "
                "are left side by side; use a larger corpus or a larger subsample threshold"
            )
        return cls(itos, model.input.weight.detach().cpu(), counts, model.output.weight.detach().cpu())

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: object) -> bool:
        return word in self.stoi

    def __repr__(self) -> str:
        return f"Word2Vec(words={len(self)}, dim={self.vectors.shape[1]})"

    def _id(self, word: str, name: str = "word") -> int:
        if not isinstance(word, str):
            raise TypeError(f"{name} must be a str, got {type(word).__name__}")
        if word not in self.stoi:
            raise ValueError(f"{name}={word!r} is not in the vocabulary ({len(self)} words)")
        return self.stoi[word]

    def vector(self, word: str) -> torch.Tensor:
        """The ``(d,)`` vector of ``word``."""
        return self.vectors[self._id(word)]

    def similarity(self, a: str, b: str) -> float:
        """Cosine similarity of the vectors of ``a`` and ``b``."""
        return float(self._unit[self._id(a, "a")] @ self._unit[self._id(b, "b")])

    def _scores(self, query: torch.Tensor, exclude: Sequence[int]) -> torch.Tensor:
        scores = self._unit @ F.normalize(query, dim=0)  # (V,) cosines
        scores[list(exclude)] = -math.inf
        return scores

    def _top(self, query: torch.Tensor, k: int, exclude: Sequence[int]) -> list[tuple[str, float]]:
        check_int("k", k, 1)
        scores = self._scores(query, exclude)
        k = min(k, len(self) - len(set(exclude)))
        top = scores.topk(k)
        return [(self.itos[i], round(float(s), 6)) for s, i in zip(top.values, top.indices.tolist())]

    def nearest(self, word: str, k: int = 10) -> list[tuple[str, float]]:
        """The ``k`` words whose vectors have the highest cosine with ``word``'s (itself excluded)."""
        i = self._id(word)
        return self._top(self._unit[i], k, [i])

    def most_similar(self, positive: Sequence[str], negative: Sequence[str] = (), k: int = 10,
                     exclude: Sequence[str] = ()) -> list[tuple[str, float]]:
        """The ``k`` words nearest (cosine) to the sum of the unit vectors of ``positive`` minus
        those of ``negative``.

        The query words themselves and the words of ``exclude`` are never answers. With
        ``positive=[b, c]`` and ``negative=[a]`` this is the analogy query ``b - a + c``
        (:meth:`analogy`); with ``positive=[b, c]`` alone it is the "ignore a" baseline of
        Linzen (2016), and with one positive word it is :meth:`nearest`.
        """
        query, excluded = self._query(positive, negative, exclude)
        return self._top(query, k, excluded)

    def rank(self, answer: str, positive: Sequence[str], negative: Sequence[str] = (),
             exclude: Sequence[str] = ()) -> int:
        """The rank of ``answer`` in the :meth:`most_similar` list of the same query (1: first).

        Ties count in ``answer``'s favour. Cheaper than listing every word: one ``(V,)`` comparison.
        """
        query, excluded = self._query(positive, negative, exclude)
        i = self._id(answer, "answer")
        if i in excluded:
            raise ValueError(f"answer={answer!r} is a query or excluded word, never an answer")
        scores = self._scores(query, excluded)
        return int((scores > scores[i]).sum()) + 1

    def _query(self, positive: Sequence[str], negative: Sequence[str],
               exclude: Sequence[str]) -> tuple[torch.Tensor, list[int]]:
        for name, group in (("positive", positive), ("negative", negative), ("exclude", exclude)):
            if isinstance(group, str) or not isinstance(group, Sequence):
                raise TypeError(f"{name} must be a sequence of words (e.g. a list), got {type(group).__name__}")
        if not positive:
            raise ValueError("positive must hold at least one word")
        plus = [self._id(w, "positive word") for w in positive]
        minus = [self._id(w, "negative word") for w in negative]
        query = self._unit[plus].sum(0) - self._unit[minus].sum(0)
        return query, plus + minus + [self._id(w, "excluded word") for w in exclude]

    def analogy(self, a: str, b: str, c: str, k: int = 5) -> list[tuple[str, float]]:
        """"``a`` is to ``b`` as ``c`` is to ?": the ``k`` words nearest (cosine) to ``b - a + c``.

        Uses unit vectors (3CosAdd, Mikolov et al., 2013c) and excludes ``a``, ``b`` and ``c`` from
        the answers, as is standard: ``most_similar([b, c], [a], k)``.
        """
        ia, ib, ic = self._id(a, "a"), self._id(b, "b"), self._id(c, "c")
        query = self._unit[ib] - self._unit[ia] + self._unit[ic]
        return self._top(query, k, [ia, ib, ic])
