"""Word-level tokenization: :class:`WordTokenizer`, one id per word or punctuation mark.

Words are cut with :func:`~companion.tokenization.split_words`; words outside the vocabulary
become ``<unk>``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from companion.tokenization._common import _check_text, _ids_list
from companion.tokenization.pre_tokenization import split_words

__all__ = ["WordTokenizer"]


class WordTokenizer:
    """Word-level tokenizer: one id per word or punctuation mark (see :func:`split_words`).

    Id 0 is ``<unk>``, which every word outside the vocabulary becomes. The others are numbered by
    decreasing frequency in the training text (ties in alphabetical order). Decoding joins tokens
    with single spaces, so the original whitespace is lost: word-level tokenization is lossy.

    Args:
        tokens: the vocabulary, most frequent first, without ``<unk>``.
        lowercase: lowercase text before splitting it.
    """

    unk_token = "<unk>"
    unk_id = 0

    def __init__(self, tokens: Sequence[str], lowercase: bool = False):
        tokens = list(tokens)
        if any(not isinstance(t, str) or not t for t in tokens):
            raise TypeError("tokens must be non-empty strings")
        if len(set(tokens)) != len(tokens) or self.unk_token in tokens:
            raise ValueError(f"tokens must be distinct and must not contain {self.unk_token!r}")
        self.itos: list[str] = [self.unk_token, *tokens]
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(self.itos)}
        self.lowercase = bool(lowercase)

    @classmethod
    def train(
        cls, text: str, max_size: int | None = None, min_freq: int = 1, lowercase: bool = False
    ) -> WordTokenizer:
        """Build the vocabulary of ``text``: its words seen at least ``min_freq`` times, the
        ``max_size - 1`` most frequent at most (``max_size`` counts ``<unk>``)."""
        words = split_words(_check_text(text), lowercase)
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1):
            raise ValueError(f"max_size must be None or an int >= 1, got {max_size!r}")
        if isinstance(min_freq, bool) or not isinstance(min_freq, int) or min_freq < 1:
            raise ValueError(f"min_freq must be an int >= 1, got {min_freq!r}")
        counts = Counter(words)
        kept = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        if max_size is not None:
            kept = kept[: max_size - 1]
        return cls(kept, lowercase)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"WordTokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase})"

    def tokenize(self, text: str) -> list[str]:
        """The words and punctuation marks of ``text``, before the vocabulary lookup."""
        return split_words(_check_text(text), self.lowercase)

    def encode(self, text: str) -> list[int]:
        """One id per word or punctuation mark of ``text``; unknown ones -> ``unk_id`` (0)."""
        return [self.stoi.get(w, self.unk_id) for w in self.tokenize(text)]

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The tokens of ``ids`` joined by single spaces."""
        ids = _ids_list(ids)
        bad = [i for i in ids if not 0 <= i < len(self.itos)]
        if bad:
            raise ValueError(f"ids must be in [0, {len(self.itos)}), got {bad[:10]}")
        return " ".join(self.itos[i] for i in ids)
