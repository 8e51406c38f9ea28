"""The incremental WordPiece trainer behind :meth:`~companion.tokenization.WordPieceTokenizer.train`.

``_count_words`` counts the words of a corpus (BERT's pre-tokenizer), ``_train_wordpiece`` merges
the pair of units with the best score until the vocabulary is full, scoring by likelihood gain
(``_likelihood_gain``, in steps of 2^-20 nats) or by ratio: the :data:`WORDPIECE_CRITERIA`. The
criteria and the algorithm are described in :meth:`~companion.tokenization.WordPieceTokenizer.train`.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable, Sequence

from companion.tokenization._common import _MASK, _SHIFT, _iter_texts, _special_splitter
from companion.tokenization.pre_tokenization import _BERT_PATTERN
from companion.utils import progress as progress_bar

__all__ = ["WORDPIECE_CRITERIA"]


def _count_words(texts: str | Iterable[str], specials: Sequence[str]) -> Counter[str]:
    """How often each word (:func:`bert_pre_tokenize`) occurs; special tokens are cut out first."""
    splitter = _special_splitter(specials)
    counts: Counter[str] = Counter()
    for text in _iter_texts(texts):
        parts = splitter.split(text)[::2] if splitter else [text]
        for part in parts:
            counts.update(_BERT_PATTERN.findall(part))
    return counts


_GAIN_STEPS = 2**20  # likelihood gains are compared in steps of 2^-20 nats (see _likelihood_gain)
WORDPIECE_CRITERIA = ("likelihood", "ratio")


def _xlogx(x: int) -> float:
    return x * math.log(x) if x > 0 else 0.0


def _likelihood_gain(m: int, c_a: int, c_b: int, n: int, same: bool) -> int:
    """Change of the training words' log-likelihood under a unigram model of the units when ``m``
    pairs ``(a, b)`` merge into a new unit, among ``n`` units in all, in steps of 2^-20 nats
    (rounded down). With :math:`f(x) = x \\ln x` it is :math:`f(c_a - m) + f(c_b - m) + f(m)
    - f(c_a) - f(c_b) + f(n) - f(n - m)`, or, when ``a == b`` (``same``), :math:`f(c_a - 2m) + f(m)
    - f(c_a) + f(n) - f(n - m)`. Steps make the comparison of two gains independent of the last
    bits of ``log``. The trainer computes the same expression, in the same order, inline."""
    if same:
        units = _xlogx(c_a - 2 * m) - _xlogx(c_a)
    else:  # a + b == b + a in floating point: the gain does not depend on the order of the pair
        units = (_xlogx(c_a - m) - _xlogx(c_a)) + (_xlogx(c_b - m) - _xlogx(c_b))
    gain = units + _xlogx(m) + (_xlogx(n) - _xlogx(n - m))
    return math.floor(gain * _GAIN_STEPS)


def _train_wordpiece(
    word_counts: Counter[str],
    vocab_size: int,
    specials: Sequence[str],
    prefix: str,
    criterion: str,
    progress: bool,
) -> list[str]:
    """The incremental WordPiece trainer of :meth:`WordPieceTokenizer.train`: the tokens in id order."""
    chars = sorted({c for word in word_counts for c in word})
    tokens = list(dict.fromkeys([*specials, *sorted({*chars, *(prefix + c for c in chars)})]))
    if vocab_size < len(tokens):
        raise ValueError(
            f"vocab_size must be at least {len(tokens)} (the special tokens, and each of the {len(chars)} "
            f"characters of the training words alone and with the prefix), got {vocab_size}"
        )
    index_of = {t: i for i, t in enumerate(tokens)}
    words = [[index_of[w[0]], *(index_of[prefix + c] for c in w[1:])] for w in word_counts]
    counts = list(word_counts.values())

    unit_count = [0] * len(tokens)
    pair_count: dict[int, int] = {}
    where: dict[int, set[int]] = {}  # pair -> words that may hold it
    pairs_of: dict[int, set[int]] = {}  # unit -> pairs that may hold it
    for i, (word, count) in enumerate(zip(words, counts)):
        for u in word:
            unit_count[u] += count
        for a, b in zip(word, word[1:]):
            key = a << _SHIFT | b
            pair_count[key] = pair_count.get(key, 0) + count
            where.setdefault(key, set()).add(i)
            pairs_of.setdefault(a, set()).add(key)
            pairs_of.setdefault(b, set()).add(key)
    total = sum(unit_count)  # n: the number of units in the training words; each merge lowers it
    # Ratios c / (c_a c_b) have denominators <= n^2, so two different ones differ by >= 1 / n^4:
    # floor(ratio * 2^shift) with 2^shift > n^4 orders them exactly, as integers.
    shift = 4 * max(total, 1).bit_length() + 1
    likelihood = criterion == "likelihood"
    floor = math.floor

    xlogx: dict[int, float] = {0: 0.0}  # f(x) = x ln x, memoised: the same counts recur constantly
    known = xlogx.get

    def f(x: int) -> float:
        value = xlogx[x] = x * math.log(x)
        return value

    def merges_in_runs(a: int, key: int) -> int:
        """How many (a, a) merges the words make: a run of r units a gives r // 2, not r - 1 pairs."""
        merges = 0
        for i in where[key]:
            run = 0
            for u in words[i]:
                if u == a:
                    run += 1
                else:
                    merges += run // 2 * counts[i]
                    run = 0
            merges += run // 2 * counts[i]
        return merges

    def entry(key: int) -> tuple:
        """Heap entry of a pair: best first, then the more frequent, then string order."""
        a, b = key >> _SHIFT, key & _MASK
        c, c_a, c_b = pair_count[key], unit_count[a], unit_count[b]
        if not likelihood:
            return (-((c << shift) // (c_a * c_b)), -c, tokens[a], tokens[b], key, c, c_a, c_b, total)
        m = c if a != b else merges_in_runs(a, key)
        f_n = known(total) or f(total)
        f_rest = known(total - m) or f(total - m)
        f_m = known(m) or f(m)
        f_a = known(c_a) or f(c_a)
        if a == b:
            f_left = known(c_a - 2 * m)
            units = (f_left if f_left is not None else f(c_a - 2 * m)) - f_a
        else:  # a + b == b + a in floating point, so the order of the pair does not matter
            f_b = known(c_b) or f(c_b)
            f_left, f_right = known(c_a - m), known(c_b - m)
            units = ((f_left if f_left is not None else f(c_a - m)) - f_a) + (
                (f_right if f_right is not None else f(c_b - m)) - f_b
            )
        gain = floor((units + f_m + (f_n - f_rest)) * _GAIN_STEPS)
        return (-gain, -c, tokens[a], tokens[b], key, c, c_a, c_b, total)

    def move(old: int, fresh: int, neighbour: int, new: int, i: int, count: int, changed: set[int]) -> None:
        """In word ``i`` (``count`` times), the pair ``old`` became ``fresh``: ``neighbour`` next to ``new``."""
        pair_count[old] -= count
        pair_count[fresh] = pair_count.get(fresh, 0) + count
        where.setdefault(fresh, set()).add(i)
        pairs_of.setdefault(neighbour, set()).add(fresh)
        pairs_of.setdefault(new, set()).add(fresh)
        changed.add(old)
        changed.add(fresh)

    heap = [entry(k) for k in pair_count]
    heapq.heapify(heap)
    n_prefix = len(prefix)
    bar = progress_bar(
        total=vocab_size - len(tokens), enabled=progress, desc="WordPiece merges", leave=False, mininterval=0.5
    )
    while len(tokens) < vocab_size and heap:
        top = heapq.heappop(heap)
        key = top[4]
        a, b = key >> _SHIFT, key & _MASK
        c = pair_count[key]
        if c < 1 or (c, unit_count[a], unit_count[b]) != top[5:8]:
            continue  # stale: an entry with the current counts was pushed when they changed
        if likelihood and top[8] != total:
            # Every gain falls as n falls, so stored gains are upper bounds: recompute this one and
            # take it only if it still beats the best bound left.
            fresh = entry(key)
            if heap and heap[0] < fresh:
                heapq.heappush(heap, fresh)
                continue
        merged = tokens[a] + tokens[b][n_prefix:]
        new = index_of.get(merged)
        if new is None:
            new = index_of[merged] = len(tokens)
            tokens.append(merged)
            unit_count.append(0)
            bar.update(1)
        changed: set[int] = set()
        for i in where.pop(key):
            word, count = words[i], counts[i]
            j = 0
            while j < len(word) - 1:
                if word[j] == a and word[j + 1] == b:
                    if j > 0:
                        prev = word[j - 1]
                        move(prev << _SHIFT | a, prev << _SHIFT | new, prev, new, i, count, changed)
                    word[j : j + 2] = (new,)
                    if j < len(word) - 1:
                        nxt = word[j + 1]
                        move(b << _SHIFT | nxt, new << _SHIFT | nxt, nxt, new, i, count, changed)
                    unit_count[a] -= count
                    unit_count[b] -= count
                    unit_count[new] += count
                    total -= count
                j += 1
        pair_count[key] = 0
        # New scores for the pairs whose count changed and for every pair holding a, b or the new
        # unit (their unit counts changed); dead pairs are dropped from the index on the way.
        for unit in {a, b, new}:
            alive = {k for k in pairs_of.get(unit, ()) if pair_count[k] > 0}
            pairs_of[unit] = alive
            changed |= alive
        for k in changed:
            if pair_count[k] > 0:
                heapq.heappush(heap, entry(k))
    bar.close()
    return tokens
