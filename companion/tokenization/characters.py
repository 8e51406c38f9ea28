"""Character-level tokenization: :class:`CharTokenizer`, one id per character plus ``<unk>``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from companion.data import CharVocab
from companion.tokenization._common import _check_text, _ids_list

__all__ = ["CharTokenizer"]


class CharTokenizer:
    """Character-level tokenizer: one id per character, plus ``<unk>`` for unseen characters.

    A thin wrapper around :class:`companion.data.CharVocab` (which numbers the distinct characters
    of a text in sorted order and refuses unknown ones): ids ``0 .. len(char_vocab) - 1`` are
    ``char_vocab``'s, and ``unk_id = len(char_vocab)`` stands for any character it lacks, so that
    held-out text can be encoded and its OOV rate measured.

    Args:
        char_vocab: the character vocabulary to wrap.
    """

    unk_token = "<unk>"

    def __init__(self, char_vocab: CharVocab):
        if not isinstance(char_vocab, CharVocab):
            raise TypeError(f"char_vocab must be a companion.data.CharVocab, got {type(char_vocab).__name__}")
        self.char_vocab = char_vocab
        self.unk_id = len(char_vocab)

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        """The tokenizer whose vocabulary is the set of characters of ``text``."""
        return cls(CharVocab.from_text(_check_text(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.char_vocab) + 1

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text`` (``len(text)`` of them); unseen characters -> ``unk_id``."""
        text = _check_text(text)
        if set(text) <= self.char_vocab.stoi.keys():
            return self.char_vocab.encode(text).tolist()
        return [self.char_vocab.stoi.get(c, self.unk_id) for c in text]

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The string of ``ids``; ``unk_id`` becomes ``"<unk>"``."""
        ids = _ids_list(ids)
        bad = [i for i in ids if not 0 <= i <= self.unk_id]
        if bad:
            raise ValueError(f"ids must be in [0, {self.unk_id}], got {bad[:10]}")
        return "".join(self.unk_token if i == self.unk_id else self.char_vocab.itos[i] for i in ids)
