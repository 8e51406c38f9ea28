"""Synthetic tasks generated on the fly, seeded, with no downloads.

* :func:`first_token_recall` — a long-range dependency classification task (Chapter 1).
* :func:`key_value_retrieval` — associative recall at a controlled distance: find the value a
  query key was paired with, ``distance`` positions back, among distractor pairs (Chapter 14b).
* Sequence-to-sequence tasks for the encoder-decoder Transformer (Chapter 9), each with its own
  source and target vocabularies (:class:`Seq2SeqVocab`): :class:`CopyTask`, :class:`ReverseTask`,
  :class:`SortTask` (symbols to symbols) and two small "translations", :class:`DateTask`
  (``2024-03-07`` -> ``7 march 2024``, which reorders) and :class:`NumberWordsTask`
  (``347`` -> ``three hundred forty seven``). ``task.sample(n, generator, split)`` returns padded
  ``(src, tgt)`` LongTensors; the target is ``<bos> y <eos>``. Every example belongs to exactly
  one of the splits ``"train"`` and ``"test"`` (about one in ten is held out), decided by a hash
  of its content, so a held-out input is never seen in training.
"""

from __future__ import annotations

import datetime
import operator
from collections.abc import Sequence

import torch

from companion._validation import check_int

__all__ = [
    "first_token_recall",
    "key_value_retrieval",
    "key_value_vocab_size",
    "Seq2SeqVocab",
    "pad_sequences",
    "Seq2SeqTask",
    "CopyTask",
    "ReverseTask",
    "SortTask",
    "DateTask",
    "NumberWordsTask",
]


def first_token_recall(
    n_samples: int,
    n_distractors: int,
    n_symbols: int = 8,
    n_noise: int = 8,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A long-range dependency task: remember the first token across ``n_distractors`` tokens.

    Each sequence is one *symbol* (ids ``0 .. n_symbols-1``) followed by ``n_distractors`` noise
    tokens (ids ``n_symbols .. n_symbols+n_noise-1``) and a final query token (the last id). The
    label is the first symbol, so a model that reads the sequence left to right must carry it
    across ``n_distractors + 1`` steps. Chance accuracy is ``1 / n_symbols``.

    Returns:
        ``(tokens, labels)``: ``(n_samples, n_distractors + 2)`` and ``(n_samples,)`` int64.
        The vocabulary size is ``n_symbols + n_noise + 1``.
    """
    for name, value, low in (("n_samples", n_samples, 1), ("n_distractors", n_distractors, 0),
                             ("n_symbols", n_symbols, 2), ("n_noise", n_noise, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    labels = torch.randint(n_symbols, (n_samples,), generator=generator)
    noise = torch.randint(n_symbols, n_symbols + n_noise, (n_samples, n_distractors), generator=generator)
    query = torch.full((n_samples, 1), n_symbols + n_noise)
    return torch.cat([labels[:, None], noise, query], dim=1), labels


def key_value_vocab_size(n_keys: int = 8, n_values: int = 8, n_filler: int = 4) -> int:
    """The vocabulary size of :func:`key_value_retrieval`: ``n_keys · n_values + n_filler + n_keys``."""
    return n_keys * n_values + n_filler + n_keys


def key_value_retrieval(
    n_samples: int,
    seq_len: int,
    distance: int | torch.Tensor,
    n_keys: int = 8,
    n_values: int = 8,
    n_pairs: int = 4,
    n_filler: int = 4,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Associative recall at a controlled distance: which value was the query key paired with?

    Each sequence is ``seq_len`` tokens: filler, ``n_pairs`` *pair* tokens with distinct keys, and at
    the last position ``seq_len - 1`` a *query* token naming one of those keys. The pair with the
    queried key sits exactly ``distance`` positions before the query, at ``seq_len - 1 - distance``;
    the other pairs (the distractors) sit at random other positions. Every value is drawn uniformly
    and independently, so nothing but the queried pair says anything about the label: a model that
    cannot see that pair is at chance, ``1 / n_values``.

    Token ids (``vocab_size = key_value_vocab_size(n_keys, n_values, n_filler)``):

    * ``key · n_values + value`` for the pair "key holds value" (``0 … n_keys · n_values − 1``);
    * ``n_keys · n_values + f`` for filler ``f < n_filler``;
    * ``n_keys · n_values + n_filler + key`` for the query "what does key hold?".

    Args:
        n_samples: sequences to draw.
        seq_len: tokens per sequence, ``>= n_pairs + 1``.
        distance: from the query back to the queried pair, in ``[1, seq_len − 1]``: one integer for
            every sequence (an ``int`` or anything ``operator.index`` accepts, e.g. ``numpy.int64``),
            or a 1-D integer tensor ``(n_samples,)`` of per-sequence distances.
        n_keys, n_values: how many keys and values exist (``n_keys >= n_pairs``, ``n_values >= 2``).
        n_pairs: pairs per sequence, the queried one included (``>= 1``).
        n_filler: distinct filler tokens (``>= 1``).
        generator: a ``torch.Generator`` (CPU) for reproducible draws.

    Returns:
        ``(tokens, labels)``: ``(n_samples, seq_len)`` and ``(n_samples,)`` int64 on the CPU; the
        labels are values in ``[0, n_values)``.
    """
    for name, value, low in (("n_samples", n_samples, 1), ("seq_len", seq_len, 2), ("n_keys", n_keys, 1),
                             ("n_values", n_values, 2), ("n_pairs", n_pairs, 1), ("n_filler", n_filler, 1)):
        check_int(name, value, low)
    if n_pairs > n_keys:
        raise ValueError(f"n_pairs must be <= n_keys={n_keys} (the keys of a sequence are distinct), got {n_pairs}")
    if n_pairs > seq_len - 1:
        raise ValueError(f"seq_len must be >= n_pairs + 1 = {n_pairs + 1} (the pairs and the query), got {seq_len}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if isinstance(distance, torch.Tensor):
        if distance.shape != (n_samples,) or distance.is_floating_point() or distance.dtype == torch.bool:
            raise ValueError(f"distance must be an int or an integer tensor of shape (n_samples,)=({n_samples},), "
                             f"got a tensor of shape {tuple(distance.shape)} and dtype {distance.dtype}")
        distance = distance.long().cpu()
    else:
        try:  # an int, numpy.int64, ...: anything operator.index accepts, except a bool
            if isinstance(distance, bool) or type(distance).__name__ == "bool_":
                raise TypeError
            distance = torch.full((n_samples,), operator.index(distance), dtype=torch.long)
        except TypeError:
            raise ValueError(f"distance must be an int or an integer tensor of shape (n_samples,), "
                             f"got {distance!r}") from None
    if int(distance.min()) < 1 or int(distance.max()) > seq_len - 1:
        raise ValueError(f"distance must lie in [1, seq_len - 1 = {seq_len - 1}], got values from "
                         f"{int(distance.min())} to {int(distance.max())}")

    n_pair_ids = n_keys * n_values
    rows = torch.arange(n_samples)[:, None]
    tokens = n_pair_ids + torch.randint(n_filler, (n_samples, seq_len), generator=generator)
    keys = torch.rand(n_samples, n_keys, generator=generator).argsort(dim=1)[:, :n_pairs]  # distinct per row
    values = torch.randint(n_values, (n_samples, n_pairs), generator=generator)
    # Positions: the queried pair (column 0) at seq_len - 1 - distance; the distractors at distinct
    # random positions before the query, never on the queried pair's.
    target = seq_len - 1 - distance  # (n_samples,)
    scores = torch.rand(n_samples, seq_len - 1, generator=generator)
    scores[torch.arange(n_samples), target] = -1.0  # rand is in [0, 1): never among the top
    others = scores.topk(n_pairs - 1, dim=1).indices  # (n_samples, n_pairs - 1)
    positions = torch.cat([target[:, None], others], dim=1)  # (n_samples, n_pairs)
    tokens[rows, positions] = keys * n_values + values
    tokens[:, -1] = n_pair_ids + n_filler + keys[:, 0]
    return tokens, values[:, 0].clone()


# --------------------------------------------------------------------------------------------
# Sequence-to-sequence tasks.
# --------------------------------------------------------------------------------------------

SPECIALS = ("<pad>", "<bos>", "<eos>")


class Seq2SeqVocab:
    """A token <-> id table with ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2 followed by ``tokens``.

    Args:
        tokens: the ordinary tokens, distinct, none of them a special token.
    """

    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self, tokens: Sequence[str]) -> None:
        tokens = list(tokens)
        if len(set(tokens)) != len(tokens) or set(tokens) & set(SPECIALS):
            raise ValueError(f"tokens must be distinct and must not contain {SPECIALS}, got {tokens!r}")
        self.itos = list(SPECIALS) + tokens
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"Seq2SeqVocab({len(self)} tokens: {self.itos[3:8]}...)"

    def encode(self, tokens: Sequence[str], bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of ``tokens``, optionally framed by ``<bos>`` / ``<eos>``; unknown tokens raise ``ValueError``."""
        unknown = [t for t in tokens if t not in self.stoi]
        if unknown:
            raise ValueError(f"tokens not in the vocabulary: {unknown[:5]!r}")
        return [self.bos_id] * bos + [self.stoi[t] for t in tokens] + [self.eos_id] * eos

    def decode(self, ids: Sequence[int] | torch.Tensor) -> list[str]:
        """Tokens of ``ids``: ``<bos>`` and ``<pad>`` dropped, stopping at the first ``<eos>``."""
        out = []
        for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
            if i == self.eos_id:
                break
            if i not in (self.pad_id, self.bos_id):
                out.append(self.itos[i])
        return out


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int = 0) -> torch.Tensor:
    """Right-pad lists of ids to one LongTensor ``(len(seqs), longest)``."""
    if not seqs:
        raise ValueError("seqs must hold at least one sequence")
    longest = max(len(s) for s in seqs)
    out = torch.full((len(seqs), longest), pad_id, dtype=torch.long)
    for row, s in enumerate(seqs):
        out[row, : len(s)] = torch.tensor(list(s), dtype=torch.long)
    return out


def _held_out(key: int) -> bool:
    # Knuth's multiplicative hash scatters neighbouring keys, so the test set is not one block.
    return (key * 2654435761) % (2**32) % 10 == 0


class Seq2SeqTask:
    """Base class: a seeded generator of (source, target) token sequences.

    Subclasses define :attr:`src_vocab`, :attr:`tgt_vocab` and :meth:`example`, which turns one
    random integer into ``(source tokens, target tokens, key)``; ``key`` decides the split.
    """

    name = "task"
    src_vocab: Seq2SeqVocab
    tgt_vocab: Seq2SeqVocab

    def example(self, draw: int) -> tuple[list[str], list[str], int]:
        """One example from a random integer ``draw`` in ``[0, 2**62)``: ``(src tokens, tgt tokens, key)``."""
        raise NotImplementedError

    def pairs(self, n: int, generator: torch.Generator | None = None,
              split: str = "train") -> list[tuple[list[str], list[str]]]:
        """``n`` examples of ``split`` (``"train"``, ``"test"`` or ``"all"``) as token lists."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
        out: list[tuple[list[str], list[str]]] = []
        while len(out) < n:
            draws = torch.randint(0, 2**62, (2 * (n - len(out)) + 8,), generator=generator).tolist()
            for d in draws:
                src, tgt, key = self.example(d)
                if split == "all" or _held_out(key) == (split == "test"):
                    out.append((src, tgt))
                    if len(out) == n:
                        break
        return out

    def sample(self, n: int, generator: torch.Generator | None = None,
               split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """A batch ``(src, tgt)``: ``(n, src_len)`` and ``(n, tgt_len)`` int64, right-padded with 0.

        The source is the source tokens; the target is ``<bos> tokens <eos>`` (teacher forcing
        feeds ``tgt[:, :-1]`` and predicts ``tgt[:, 1:]``).
        """
        pairs = self.pairs(n, generator, split)
        src = pad_sequences([self.src_vocab.encode(s) for s, _ in pairs], self.src_vocab.pad_id)
        tgt = pad_sequences([self.tgt_vocab.encode(t, bos=True, eos=True) for _, t in pairs], self.tgt_vocab.pad_id)
        return src, tgt


class _SymbolTask(Seq2SeqTask):
    def __init__(self, n_symbols: int = 10, min_len: int = 3, max_len: int = 8) -> None:
        for name, value, low in (("n_symbols", n_symbols, 2), ("min_len", min_len, 1), ("max_len", max_len, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if n_symbols > 26:
            raise ValueError(f"n_symbols must be <= 26 (letters a-z), got {n_symbols}")
        if min_len > max_len:
            raise ValueError(f"min_len must be <= max_len, got {min_len} > {max_len}")
        self.n_symbols, self.min_len, self.max_len = n_symbols, min_len, max_len
        symbols = [chr(ord("a") + i) for i in range(n_symbols)]
        self.src_vocab = self.tgt_vocab = Seq2SeqVocab(symbols)
        self.symbols = symbols

    def transform(self, xs: list[str]) -> list[str]:
        """The target of source tokens ``xs``."""
        raise NotImplementedError

    def example(self, draw: int) -> tuple[list[str], list[str], int]:
        """A random symbol string and its transform; the key hashes the string."""
        span = self.max_len - self.min_len + 1
        length = self.min_len + draw % span
        draw //= span
        xs = []
        for _ in range(length):
            xs.append(self.symbols[draw % self.n_symbols])
            draw //= self.n_symbols
            if draw == 0:  # ran out of random digits: reseed deterministically from what we have
                draw = (len(xs) * 0x9E3779B97F4A7C15 + sum(map(ord, xs))) % (2**61)
        key = 0
        for t in xs:
            key = key * 31 + ord(t)
        return xs, self.transform(xs), key * 7 + length


class CopyTask(_SymbolTask):
    """Copy a string of ``min_len .. max_len`` symbols: ``a c b`` -> ``a c b``."""

    name = "copy"

    def transform(self, xs: list[str]) -> list[str]:
        """The same tokens."""
        return list(xs)


class ReverseTask(_SymbolTask):
    """Reverse a string of symbols: ``a c b`` -> ``b c a``."""

    name = "reverse"

    def transform(self, xs: list[str]) -> list[str]:
        """The tokens in reverse order."""
        return xs[::-1]


class SortTask(_SymbolTask):
    """Sort a string of symbols alphabetically: ``c a b`` -> ``a b c``."""

    name = "sort"

    def transform(self, xs: list[str]) -> list[str]:
        """The tokens sorted."""
        return sorted(xs)


MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december")


class DateTask(Seq2SeqTask):
    """ISO dates to written-out dates: ``2024-03-07`` (10 characters) -> ``7 march 2024``.

    The source is character-level (digits and ``-``); the target is the day as one token
    (``1`` .. ``31``), the month as a word, and the year digit by digit, so the output reorders
    the input: the day comes from the last two source characters, the year from the first four.
    Dates run from ``first_year``-01-01 to ``last_year``-12-31; the key is the day number.
    """

    name = "date"

    def __init__(self, first_year: int = 1900, last_year: int = 2099) -> None:
        if not (isinstance(first_year, int) and isinstance(last_year, int) and 1 <= first_year <= last_year <= 9999):
            raise ValueError(f"need 1 <= first_year <= last_year <= 9999, got {first_year!r}, {last_year!r}")
        self.start = datetime.date(first_year, 1, 1).toordinal()
        self.n_days = datetime.date(last_year, 12, 31).toordinal() - self.start + 1
        digits = [str(d) for d in range(10)]
        self.src_vocab = Seq2SeqVocab(digits + ["-"])
        days = [str(d) for d in range(10, 32)]
        self.tgt_vocab = Seq2SeqVocab(digits + days + list(MONTHS))

    def example(self, draw: int) -> tuple[list[str], list[str], int]:
        """The date ``draw mod n_days`` days after the first one."""
        key = draw % self.n_days
        d = datetime.date.fromordinal(self.start + key)
        src = list(d.isoformat())
        tgt = [str(d.day), MONTHS[d.month - 1], *f"{d.year:04d}"]
        return src, tgt, key


_ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
         "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def _words_below_1000(n: int) -> list[str]:
    out = []
    if n >= 100:
        out += [_ONES[n // 100], "hundred"]
        n %= 100
        if n == 0:
            return out
    if n >= 20:
        out.append(_TENS[n // 10])
        if n % 10:
            out.append(_ONES[n % 10])
    elif n or not out:
        out.append(_ONES[n])
    return out


class NumberWordsTask(Seq2SeqTask):
    """Digits to English words: ``347`` -> ``three hundred forty seven``; ``12005`` -> ``twelve thousand five``.

    Numbers are drawn uniformly from ``0 .. max_value`` (at most 999 999). The source is the
    digits; the target is word-level. The key is the number itself.
    """

    name = "number_words"

    def __init__(self, max_value: int = 9999) -> None:
        if isinstance(max_value, bool) or not isinstance(max_value, int) or not 9 <= max_value <= 999_999:
            raise ValueError(f"max_value must be an int in [9, 999999], got {max_value!r}")
        self.max_value = max_value
        self.src_vocab = Seq2SeqVocab([str(d) for d in range(10)])
        words = list(_ONES) + [t for t in _TENS if t] + ["hundred", "thousand"]
        self.tgt_vocab = Seq2SeqVocab(words)

    @staticmethod
    def words(n: int) -> list[str]:
        """English words of ``0 <= n <= 999999``, without "and" or hyphens."""
        if n >= 1000:
            rest = _words_below_1000(n % 1000) if n % 1000 else []
            return _words_below_1000(n // 1000) + ["thousand"] + rest
        return _words_below_1000(n)

    def example(self, draw: int) -> tuple[list[str], list[str], int]:
        """The number ``draw mod (max_value + 1)``."""
        n = draw % (self.max_value + 1)
        return list(str(n)), self.words(n), n
