"""Tokenizers, from characters to byte-level BPE and WordPiece: the trade-offs of Chapter 2, in code.

Four ways to turn text into integer ids:

- :class:`CharTokenizer`: one id per character (a thin wrapper around
  :class:`companion.data.CharVocab`, adding an ``<unk>`` id for characters never seen in training).
  Tiny vocabulary, long sequences.
- :class:`WordTokenizer`: one id per word or punctuation mark, ``<unk>`` for words outside the
  vocabulary. Short sequences, huge vocabulary, and out-of-vocabulary (OOV) words.
- :class:`BPETokenizer`: byte-level Byte-Pair Encoding (Sennrich et al., 2016; the byte-level
  variant of GPT-2, Radford et al., 2019). Start from the 256 bytes, so that any string can be
  encoded (no OOV, ever), then repeatedly merge the most frequent adjacent pair into a new token.
- :class:`WordPieceTokenizer`: BERT's WordPiece (Schuster & Nakajima, 2012; Devlin et al., 2019).
  Words are cut greedily into the longest vocabulary pieces, ``##`` marking a piece that continues
  a word; a word with a character the vocabulary lacks becomes ``[UNK]`` as a whole. Training
  merges the pair of units that most increases the likelihood of the training words.

The BPE trainer reproduces Hugging Face ``tokenizers``' ``BpeTrainer`` merge for merge (with the
``ByteLevel`` pre-tokenizer, ``add_prefix_space=False`` and the full byte alphabet as initial
alphabet), and :meth:`BPETokenizer.to_hf` exports a ``tokenizers.Tokenizer`` that encodes every
string to the same ids. See :meth:`BPETokenizer.train` for the tie-breaking rule. The WordPiece
tokenizer encodes to the same ids as HF's ``WordPiece`` model behind a ``BertPreTokenizer``
(:meth:`WordPieceTokenizer.to_hf` builds one); with a :class:`BertNormalizer` (lower-casing, accent
stripping, CJK and control characters) and :meth:`WordPieceTokenizer.from_tokenizer_json` it reads a
pre-trained BERT's ``tokenizer.json`` and encodes as that model's fast tokenizer does.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import regex
import torch

from companion._validation import check_int
from companion.data import CharVocab
from companion.utils import progress as progress_bar

__all__ = [
    "GPT2_PATTERN",
    "GPT4_PATTERN",
    "PATTERNS",
    "bytes_to_unicode",
    "split_words",
    "CharTokenizer",
    "WordTokenizer",
    "BPETokenizer",
    "train_bpe_naive",
    "BERT_SPECIAL_TOKENS",
    "bert_pre_tokenize",
    "BertNormalizer",
    "WordPieceTokenizer",
]

# The pre-tokenization patterns. Text is first cut into chunks with one of these, and merges never
# cross a chunk boundary (so " the" and "the." never merge into one token).
# GPT-2's pattern (Radford et al., 2019), also the one inside HF's ByteLevel pre-tokenizer.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# GPT-4's pattern (tiktoken's cl100k_base): case-insensitive contractions, numbers in groups of at
# most three digits, newlines kept apart from other whitespace.
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
    r"""|\s*[\r\n]|\s+(?!\S)|\s+"""
)
PATTERNS: dict[str, str] = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN}

_WORD_PATTERN = regex.compile(r"\w+|[^\w\s]")
_FORMAT = "companion.BPETokenizer"
_SHIFT = 24  # pair (a, b) is stored as the int a << 24 | b: ints hash faster than tuples
_MASK = (1 << _SHIFT) - 1


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each of the 256 bytes to a printable Unicode character.

    Printable Latin-1 bytes stand for themselves; the 68 others (controls, space, soft hyphen) are
    shifted to ``U+0100`` and up, in byte order (so the space byte 32 becomes ``'Ġ'``, newline
    ``'Ċ'``). HF's ``ByteLevel`` pre-tokenizer writes tokens with these characters.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return dict(sorted(mapping.items()))


_BYTE_TO_CHAR = bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}
# HF numbers the 256 initial tokens by the code point of their stand-in character (its trainer sorts
# the alphabet), and breaks ties between equally frequent pairs by those numbers: we need the rank.
_HF_BYTE_RANK = [0] * 256
for _rank, _char in enumerate(sorted(_BYTE_TO_CHAR.values())):
    _HF_BYTE_RANK[_CHAR_TO_BYTE[_char]] = _rank


def _to_unicode(token: bytes) -> str:
    return "".join(_BYTE_TO_CHAR[b] for b in token)


def _from_unicode(token: str) -> bytes:
    return bytes(_CHAR_TO_BYTE[c] for c in token)


def split_words(text: str, lowercase: bool = False) -> list[str]:
    """Split ``text`` into words (runs of letters, digits, underscore) and single punctuation marks.

    Whitespace is dropped. This is the word-level tokenization of :class:`WordTokenizer` and of the
    word2vec corpus in :mod:`companion.embeddings`.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _WORD_PATTERN.findall(text.lower() if lowercase else text)


def _ids_list(ids: Sequence[int] | torch.Tensor, name: str = "ids") -> list[int]:
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(ids.shape)}")
        return ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{name} must be a sequence of ints or a 1-D tensor, got {type(ids).__name__}")
    out = list(ids)
    for i in out:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"{name} must contain ints, got {type(i).__name__} ({i!r})")
    return out


def _check_text(text: Any, name: str = "text") -> str:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    return text


# --------------------------------------------------------------------------------------------------
# Character and word tokenizers
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Byte-level BPE
# --------------------------------------------------------------------------------------------------


def _resolve_pattern(pattern: str) -> str:
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be 'gpt2', 'gpt4' or a regex string, got {type(pattern).__name__}")
    pattern = PATTERNS.get(pattern, pattern)
    try:
        regex.compile(pattern)
    except regex.error as err:
        raise ValueError(f"pattern is not a valid regex: {err}") from err
    return pattern


def _check_specials(special_tokens: Iterable[str]) -> list[str]:
    if isinstance(special_tokens, str):
        raise TypeError("special_tokens must be a list of strings, not a single string")
    specials = list(special_tokens)
    for s in specials:
        if not isinstance(s, str) or not s:
            raise TypeError(f"special_tokens must be non-empty strings, got {s!r}")
    if len(set(specials)) != len(specials):
        raise ValueError(f"special_tokens must be distinct, got {specials}")
    return specials


def _special_splitter(specials: Sequence[str]) -> regex.Pattern | None:
    if not specials:
        return None
    # Longest first, so that at any position the longest special wins (HF: leftmost-longest).
    alternatives = sorted(specials, key=len, reverse=True)
    return regex.compile("(" + "|".join(regex.escape(s) for s in alternatives) + ")")


def _encode_around_specials(
    text: str,
    special_regex: regex.Pattern | None,
    special_ids: dict[str, int],
    encode_ordinary: Callable[[str, list[int]], None],
) -> list[int]:
    """Ids of ``text``: special tokens (found by ``special_regex``) become their ids, and each stretch
    of text between them is appended by ``encode_ordinary(stretch, ids)``."""
    ids: list[int] = []
    if special_regex is None:
        encode_ordinary(text, ids)
        return ids
    for k, part in enumerate(special_regex.split(text)):
        if k % 2:  # split() with a capture group puts the matched specials at odd positions
            ids.append(special_ids[part])
        elif part:
            encode_ordinary(part, ids)
    return ids


def _encode_cached(
    pieces: Iterable[str], cache: dict[str, list[int]], encode_piece: Callable[[str], list[int]], ids: list[int]
) -> None:
    """Append the ids of each pre-tokenized piece to ``ids``, remembering each distinct piece's ids."""
    if len(cache) > 200_000:  # bound memory on endless streams of new pieces
        cache.clear()
    for piece in pieces:
        found = cache.get(piece)
        if found is None:
            found = cache[piece] = encode_piece(piece)
        ids.extend(found)


def _iter_texts(texts: str | Iterable[str]) -> Iterable[str]:
    if isinstance(texts, str):
        yield texts
        return
    if not isinstance(texts, Iterable):
        raise TypeError(f"texts must be a str or an iterable of str, got {type(texts).__name__}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts must contain only str, but item {i} is {type(t).__name__}")
        yield t


def _count_chunks(texts: str | Iterable[str], pattern: str, specials: Sequence[str]) -> Counter[str]:
    """How often each pre-tokenized chunk occurs. Special tokens are cut out first and not counted."""
    splitter = _special_splitter(specials)
    findall = regex.compile(pattern).findall
    counts: Counter[str] = Counter()
    for text in _iter_texts(texts):
        parts = splitter.split(text)[::2] if splitter else [text]  # odd items are the specials
        for part in parts:
            counts.update(findall(part))
    return counts


def _check_vocab_size(vocab_size: Any, n_special: int) -> int:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if vocab_size < 256 + n_special:
        raise ValueError(
            f"vocab_size must be at least 256 (the bytes) + {n_special} (special tokens) = "
            f"{256 + n_special}, got {vocab_size}"
        )
    return vocab_size


def _dedupe_keep_last(record: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merges as HF stores them: each distinct pair once, at the rank of its *last* merge.

    A pair is merged twice only in a rare HF corner case (see :meth:`BPETokenizer.train`); HF keeps
    the merges in a map from pair to rank, so the later rank overwrites the earlier one.
    """
    last = {pair: r for r, pair in enumerate(record)}
    return [pair for r, pair in enumerate(record) if last[pair] == r]


def _train_fast(
    chunk_counts: Counter[str], n_new: int, progress: bool
) -> tuple[list[bytes], list[tuple[int, int]]]:
    """The incremental BPE trainer. Returns (tokens in id order, merge record in order)."""
    vocab = [bytes([b]) for b in range(256)]
    index_of = {tok: i for i, tok in enumerate(vocab)}
    # Unique chunks with their frequencies: Shakespeare's 1.3 M chunks are only 35 k distinct ones.
    words = [list(chunk.encode("utf-8")) for chunk in chunk_counts]
    counts = list(chunk_counts.values())

    pair_counts: dict[int, int] = {}
    where: dict[int, set[int]] = {}
    for i, (word, count) in enumerate(zip(words, counts)):
        for a, b in zip(word, word[1:]):
            key = a << _SHIFT | b
            pair_counts[key] = pair_counts.get(key, 0) + count
            pos = where.get(key)
            if pos is None:
                where[key] = {i}
            else:
                pos.add(i)

    rank = _HF_BYTE_RANK + []  # rank[id]: HF's number for token id, for tie-breaking; grows with merges

    def tie(key: int) -> int:
        return rank[key >> _SHIFT] << _SHIFT | rank[key & _MASK]

    # Max-heap via negated counts. Each entry carries the words to visit when it is merged, as in
    # HF; entries whose count went stale are re-pushed with the current count when popped (lazy
    # invalidation), so the heap never needs a decrease-key.
    serial = 0
    heap = []
    for key, pos in where.items():
        if pair_counts[key] > 0:
            heap.append((-pair_counts[key], tie(key), serial, key, pos))
            serial += 1
    heapq.heapify(heap)

    record: list[tuple[int, int]] = []
    bar = progress_bar(total=n_new, enabled=progress, desc="BPE merges", leave=False, mininterval=0.5)
    target = 256 + n_new
    while len(vocab) < target and heap:
        neg, tie_key, _, key, pos = heapq.heappop(heap)
        current = pair_counts[key]
        if -neg != current:
            heapq.heappush(heap, (-current, tie_key, serial, key, pos))
            serial += 1
            continue
        if current < 1:
            break
        a, b = key >> _SHIFT, key & _MASK
        merged = vocab[a] + vocab[b]
        new = index_of.get(merged)
        if new is None:  # HF reuses the id when two different pairs spell the same bytes
            new = len(vocab)
            vocab.append(merged)
            index_of[merged] = new
            rank.append(len(rank))
            bar.update(1)
        record.append((a, b))

        # Merge (a, b) in the words of this entry, left to right, and update the pair counts of
        # the neighbours. As in HF, the merged pair's own count is left as it is: the entry that
        # carried it is gone from the heap.
        touched: dict[int, set[int]] = {}
        for i in pos:
            word = words[i]
            n = len(word)
            if n < 2:
                continue
            count = counts[i]
            j = 0
            while j < n - 1:
                if word[j] == a and word[j + 1] == b:
                    if j > 0:
                        prev = word[j - 1]
                        k_old = prev << _SHIFT | a
                        pair_counts[k_old] -= count
                        k_new = prev << _SHIFT | new
                        pair_counts[k_new] = pair_counts.get(k_new, 0) + count
                        touched.setdefault(k_new, set()).add(i)
                    word[j : j + 2] = (new,)
                    n -= 1
                    if j < n - 1:
                        nxt = word[j + 1]
                        k_old = b << _SHIFT | nxt
                        pair_counts[k_old] -= count
                        k_new = new << _SHIFT | nxt
                        pair_counts[k_new] = pair_counts.get(k_new, 0) + count
                        touched.setdefault(k_new, set()).add(i)
                j += 1
        for k, where_k in touched.items():
            c = pair_counts[k]
            if c > 0:
                heapq.heappush(heap, (-c, tie(k), serial, k, where_k))
                serial += 1
    bar.close()
    return vocab, record


class BPETokenizer:
    """Byte-level Byte-Pair Encoding tokenizer (Sennrich et al., 2016; GPT-2's byte-level variant).

    Ids ``0..255`` are the single bytes, then one id per merged token in the order training created
    them, then the special tokens. Encoding a string: cut out the special tokens, cut the rest into
    chunks with the regex ``pattern``, turn each chunk into its UTF-8 bytes and, repeatedly, merge
    the adjacent pair with the lowest merge rank (the leftmost one among equals) until no learned
    merge applies. Every string can be encoded, since every byte is a token.

    Build one with :meth:`train` or :meth:`load`; the constructor checks a vocabulary given by hand.

    Args:
        tokens: the bytes of each non-special token, in id order; the first 256 must be the
            single bytes ``0..255``.
        merges: learned pairs of token ids ``(left, right)``, lowest rank first; the bytes of
            ``left + right`` must be a token.
        pattern: ``"gpt2"``, ``"gpt4"`` or a regex for the pre-tokenizer.
        special_tokens: strings that are never split or merged; they get the ids after ``tokens``.
    """

    def __init__(
        self,
        tokens: Sequence[bytes],
        merges: Sequence[tuple[int, int]],
        pattern: str = "gpt2",
        special_tokens: Iterable[str] = (),
    ):
        tokens = list(tokens)
        if len(tokens) < 256 or any(tokens[b] != bytes([b]) for b in range(256)):
            raise ValueError("tokens must start with the 256 single bytes 0..255 in order")
        if any(not isinstance(t, bytes) or not t for t in tokens):
            raise ValueError("tokens must be non-empty bytes")
        index_of = {t: i for i, t in enumerate(tokens)}
        if len(index_of) != len(tokens):
            raise ValueError("tokens must be distinct")
        ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for r, pair in enumerate(merges):
            if (
                not isinstance(pair, (tuple, list))
                or len(pair) != 2
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in pair)
            ):
                raise ValueError(f"merge {r} must be a pair of ints, got {pair!r}")
            a, b = pair
            if not (0 <= a < len(tokens) and 0 <= b < len(tokens)):
                raise ValueError(f"merge {r} = {pair!r} refers to an id outside [0, {len(tokens)})")
            new = index_of.get(tokens[a] + tokens[b])
            if new is None:
                raise ValueError(f"merge {r} = {pair!r} makes {tokens[a] + tokens[b]!r}, which is not a token")
            if (a, b) in ranks:
                raise ValueError(f"merge {r} = {pair!r} appears twice")
            ranks[(a, b)] = (r, new)
        made = {new for _, new in ranks.values()}
        orphans = [i for i in range(256, len(tokens)) if i not in made]
        if orphans:
            raise ValueError(f"tokens {orphans[:10]} are made by no merge")
        specials = _check_specials(special_tokens)

        self.pattern = _resolve_pattern(pattern)
        self.merges: list[tuple[int, int]] = [tuple(m) for m in merges]
        self.special_tokens: dict[str, int] = {s: len(tokens) + i for i, s in enumerate(specials)}
        self.vocab: dict[int, bytes] = dict(enumerate(tokens))
        self.vocab.update({i: s.encode("utf-8") for s, i in self.special_tokens.items()})
        self._tokens = tokens
        self._ranks = ranks
        self._regex = regex.compile(self.pattern)
        self._special_regex = _special_splitter(specials)
        self._cache: dict[str, list[int]] = {}

    # -- training -----------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        texts: str | Iterable[str],
        vocab_size: int,
        pattern: str = "gpt2",
        special_tokens: Iterable[str] = (),
        progress: bool = False,
    ) -> BPETokenizer:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from ``texts``.

        The algorithm (fast, exact): pre-tokenize every text with ``pattern`` and count each
        distinct chunk once, with its frequency; count the adjacent byte pairs of those unique
        chunks, weighted by frequency, remembering which chunks hold each pair; put the pairs in a
        max-heap by count. Then, per merge: pop the best pair (a popped entry whose count is stale
        is pushed back with its current count), give it a new id, merge it inside only the chunks
        that contain it, and update the counts of the neighbouring pairs it destroyed and created.
        Cost per merge: proportional to the chunks holding the pair, not to the corpus.

        Tie-breaking (deterministic, identical to HF ``tokenizers``' ``BpeTrainer``): among pairs
        with the same count, the pair ``(left, right)`` that is smallest in HF's token numbering
        wins, comparing ``left`` first. HF numbers the 256 byte tokens by the code point of their
        GPT-2 stand-in character (:func:`bytes_to_unicode`: ``!``..``~``, then Latin-1 letters,
        then the control bytes and space, which map to ``U+0100`` and up) and merged tokens by
        creation order, after all bytes.

        The bookkeeping follows HF's trainer step for step (each heap entry carries the chunks to
        visit; a merged pair's own count is left as it was), so that even its corner cases agree:
        should a merge spell the bytes of an existing token, that id is reused, and a pair merged
        twice is kept once in :attr:`merges`, at its last rank, as HF's map of merges keeps it.
        (Our randomised tests against HF never produced such a case.) One deliberate difference:
        special tokens found in ``texts`` are cut out before counting, where HF counts their pieces
        as ordinary text; on text without them the merges are identical.

        Args:
            texts: a string or an iterable of strings (each is pre-tokenized on its own).
            vocab_size: the size of the final vocabulary, bytes and special tokens included.
            pattern: ``"gpt2"`` (default, as HF's ``ByteLevel`` pre-tokenizer), ``"gpt4"``, or a regex.
            special_tokens: strings never split or merged; ids after all learned tokens.
            progress: show a ``tqdm`` bar over the merges.

        Returns:
            The trained tokenizer. If the corpus runs out of pairs, the vocabulary is smaller.
        """
        specials = _check_specials(special_tokens)
        vocab_size = _check_vocab_size(vocab_size, len(specials))
        pattern = _resolve_pattern(pattern)
        chunk_counts = _count_chunks(texts, pattern, specials)
        tokens, record = _train_fast(chunk_counts, vocab_size - 256 - len(specials), progress)
        return cls(tokens, _dedupe_keep_last(record), pattern, specials)

    def truncated(self, vocab_size: int) -> BPETokenizer:
        """The tokenizer with only the first ``vocab_size - 256 - len(specials)`` learned tokens.

        BPE training is greedy, so this is what :meth:`train` returns with the smaller
        ``vocab_size`` on the same corpus (exactly so when no merge re-spelled an existing token,
        i.e. when ``len(merges) == vocab_size - 256 - len(special_tokens)``).
        """
        n_special = len(self.special_tokens)
        vocab_size = _check_vocab_size(vocab_size, n_special)
        if vocab_size > self.vocab_size:
            raise ValueError(f"vocab_size must be <= the current {self.vocab_size}, got {vocab_size}")
        n_tokens = vocab_size - n_special
        merges = [(a, b) for a, b in self.merges if self._ranks[(a, b)][1] < n_tokens]
        return BPETokenizer(self._tokens[:n_tokens], merges, self.pattern, self.special_tokens)

    # -- encoding and decoding ------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of ids: bytes, learned tokens and special tokens."""
        return len(self.vocab)

    def __repr__(self) -> str:
        name = next((k for k, v in PATTERNS.items() if v == self.pattern), "custom")
        return (
            f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, pattern={name!r}, "
            f"special_tokens={list(self.special_tokens)})"
        )

    def _bpe(self, chunk: bytes) -> list[int]:
        """Merge the bytes of one chunk: lowest-rank adjacent pair first, leftmost among equals."""
        ids = list(chunk)
        ranks = self._ranks
        while len(ids) > 1:
            best, best_rank = -1, len(ranks)
            for j in range(len(ids) - 1):
                found = ranks.get((ids[j], ids[j + 1]))
                if found is not None and found[0] < best_rank:
                    best, best_rank = j, found[0]
            if best < 0:
                break
            ids[best : best + 2] = (ranks[(ids[best], ids[best + 1])][1],)
        return ids

    def _encode_ordinary(self, text: str, ids: list[int]) -> None:
        _encode_cached(self._regex.findall(text), self._cache, lambda chunk: self._bpe(chunk.encode("utf-8")), ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens in it become their single ids."""
        return _encode_around_specials(_check_text(text), self._special_regex, self.special_tokens,
                                       self._encode_ordinary)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The text of ``ids``. Byte sequences that are not valid UTF-8 (a multi-byte character cut
        between tokens, or ids put together by hand) become U+FFFD replacement characters."""
        ids = _ids_list(ids)
        vocab = self.vocab
        try:
            data = b"".join([vocab[i] for i in ids])
        except KeyError:
            bad = [i for i in ids if i not in vocab]
            raise ValueError(f"ids must be in [0, {self.vocab_size}), got {bad[:10]}") from None
        return data.decode("utf-8", errors="replace")

    def tokenize(self, text: str) -> list[str]:
        """The tokens of ``text`` as strings (a token that is part of a character shows as U+FFFD)."""
        return [self.vocab[i].decode("utf-8", errors="replace") for i in self.encode(text)]

    # -- persistence and Hugging Face export ----------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description: tokens in GPT-2's byte-to-character spelling, merges as id pairs."""
        return {
            "format": _FORMAT,
            "version": 1,
            "pattern": self.pattern,
            "tokens": [_to_unicode(t) for t in self._tokens],
            "merges": [list(m) for m in self.merges],
            "special_tokens": list(self.special_tokens),
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the tokenizer to ``path`` as JSON (read it back with :meth:`load`)."""
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        """Read a tokenizer written by :meth:`save`; a damaged file raises ``ValueError``."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path} is not a saved BPETokenizer (not valid JSON: {err})") from err
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(f"{path} is not a saved BPETokenizer (missing 'format': {_FORMAT!r})")
        if data.get("version") != 1:
            raise ValueError(f"{path}: unsupported version {data.get('version')!r}, expected 1")
        missing = [k for k in ("pattern", "tokens", "merges", "special_tokens") if k not in data]
        if missing:
            raise ValueError(f"{path} is a damaged BPETokenizer file: missing {missing}")
        try:
            tokens = [_from_unicode(t) for t in data["tokens"]]
            merges = [tuple(m) for m in data["merges"]]
        except (KeyError, TypeError) as err:
            raise ValueError(f"{path} is a damaged BPETokenizer file: bad tokens or merges ({err!r})") from err
        try:
            return cls(tokens, merges, data["pattern"], data["special_tokens"])
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path} is a damaged BPETokenizer file: {err}") from err

    def to_hf(self):
        """This tokenizer as a Hugging Face ``tokenizers.Tokenizer`` that encodes to the same ids.

        It follows HF's byte-level conventions: a ``BPE`` model whose tokens are spelled with
        :func:`bytes_to_unicode`, the ``ByteLevel`` pre-tokenizer (``add_prefix_space=False``; for a
        pattern other than GPT-2's, a regex ``Split`` first and ``ByteLevel`` without its regex),
        the ``ByteLevel`` decoder, and the special tokens as added tokens with our ids. Save it
        with ``.save("tokenizer.json")``.

        One caveat: HF pre-tokenizes with its own regex engine (Oniguruma), we with ``regex``. Both
        classify letters, digits and spaces by Unicode tables and agree on every character our
        tests draw (those assigned in Unicode 14); ``regex`` already knows Unicode 17, so a
        character added in the most recent versions can be cut differently by the two.
        """
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        vocab = {_to_unicode(t): i for i, t in enumerate(self._tokens)}
        merges = [(_to_unicode(self._tokens[a]), _to_unicode(self._tokens[b])) for a, b in self.merges]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        if self.pattern == GPT2_PATTERN:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(self.pattern), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        tok.decoder = decoders.ByteLevel()
        if self.special_tokens:
            tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in self.special_tokens])
            got = {s: tok.token_to_id(s) for s in self.special_tokens}
            if got != self.special_tokens:  # would only happen if HF changed how it numbers added tokens
                raise RuntimeError(f"HF numbered the special tokens {got}, expected {self.special_tokens}")
        return tok


def train_bpe_naive(
    texts: str | Iterable[str], vocab_size: int, pattern: str = "gpt2", progress: bool = False
) -> BPETokenizer:
    """Textbook BPE training, for teaching and as the baseline of ``benchmarks/bpe.py``.

    Every merge recounts all adjacent pairs of the whole pre-tokenized corpus (every chunk, not the
    unique ones), picks the most frequent (ties broken as in :meth:`BPETokenizer.train`) and
    rewrites every chunk. Cost per merge: proportional to the corpus. Same merges as the fast
    trainer whenever no merge re-spells an existing token.
    """
    pattern = _resolve_pattern(pattern)
    vocab_size = _check_vocab_size(vocab_size, 0)
    findall = regex.compile(pattern).findall
    chunks = [list(c.encode("utf-8")) for text in _iter_texts(texts) for c in findall(text)]
    tokens = [bytes([b]) for b in range(256)]
    index_of = {t: i for i, t in enumerate(tokens)}
    rank = _HF_BYTE_RANK + []
    record: list[tuple[int, int]] = []
    bar = progress_bar(total=vocab_size - 256, enabled=progress, desc="naive BPE", leave=False)
    while len(tokens) < vocab_size:
        counts: Counter[tuple[int, int]] = Counter()
        for chunk in chunks:
            counts.update(zip(chunk, chunk[1:]))
        if not counts:
            break
        a, b = min(counts, key=lambda p: (-counts[p], rank[p[0]], rank[p[1]]))
        merged = tokens[a] + tokens[b]
        new = index_of.get(merged)
        if new is None:
            new = index_of[merged] = len(tokens)
            tokens.append(merged)
            rank.append(len(rank))
            bar.update(1)
        record.append((a, b))
        for chunk in chunks:
            j = 0
            while j < len(chunk) - 1:
                if chunk[j] == a and chunk[j + 1] == b:
                    chunk[j : j + 2] = (new,)
                j += 1
    bar.close()
    return BPETokenizer(tokens, _dedupe_keep_last(record), pattern)


# --------------------------------------------------------------------------------------------------
# WordPiece (BERT)
# --------------------------------------------------------------------------------------------------

BERT_SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# BERT's pre-tokenizer: whitespace separates words and is dropped; every punctuation character is a
# word of its own. Whitespace is Unicode's White_Space property (Rust's ``char::is_whitespace``, as in
# HF ``tokenizers``); punctuation is ASCII punctuation (which includes symbols such as ``$ + < = > ^
# ` | ~``) or Unicode general category P, as in BERT's original ``_is_punctuation``.
_ASCII_PUNCT = regex.escape(string.punctuation)
_BERT_PATTERN = regex.compile(rf"[\p{{P}}{_ASCII_PUNCT}]|[^\p{{White_Space}}\p{{P}}{_ASCII_PUNCT}]+")


def bert_pre_tokenize(text: str) -> list[str]:
    """Cut ``text`` into words as BERT's pre-tokenizer does (HF ``tokenizers.pre_tokenizers.BertPreTokenizer``).

    Whitespace separates words and is dropped; each punctuation character becomes a word of its own:
    ``"Hello, world!"`` -> ``["Hello", ",", "world", "!"]``. Whitespace means Unicode's
    ``White_Space`` property; punctuation means ASCII punctuation or Unicode category ``P*``.

    Caveat: HF classifies punctuation with an older Unicode table (before version 9.0), so it does
    not split on some 140 punctuation characters added to Unicode since (for example U+2E43) and
    still splits on three characters Unicode later reclassified (such as U+166D). The two agree on
    every character of Unicode 3.2, U+166D aside, which is what the tests draw from.
    """
    return _BERT_PATTERN.findall(_check_text(text))


# BERT's normaliser. Control characters are Unicode's categories Cc, Cf, Co and Cs, tab, newline
# and carriage return aside (those are whitespace), plus NUL and U+FFFD. The CJK blocks are those
# of HF ``tokenizers``, which start the fifth extension block at U+2B920 where BERT's original code
# (and Unicode) starts it at U+2B820.
_BERT_CONTROL = regex.compile(r"(?![\t\n\r])[\x00\ufffd\p{Cc}\p{Cf}\p{Co}\p{Cs}]")
_WHITESPACE = regex.compile(r"\p{White_Space}")
_CJK = regex.compile(
    "[\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f\U0002b740-\U0002b81f"
    "\U0002b920-\U0002ceaf\uf900-\ufaff\U0002f800-\U0002fa1f]"
)
_NONSPACING_MARK = regex.compile(r"\p{Mn}")


class BertNormalizer:
    """BERT's text normaliser, HF ``tokenizers.normalizers.BertNormalizer`` step for step.

    In order, each step optional:

    1. ``clean_text``: drop control characters (Unicode categories ``Cc``, ``Cf``, ``Co``, ``Cs``,
       and ``U+FFFD``), then turn every whitespace character (tab and newline included) into a space.
    2. ``handle_chinese_chars``: put a space on each side of every CJK ideograph, so that the
       pre-tokenizer makes each one a word: ``"北京"`` -> ``" 北  京 "``.
    3. ``strip_accents``: decompose (Unicode NFD) and drop the non-spacing marks (category ``Mn``):
       ``"café"`` -> ``"cafe"``. ``None`` (the default) means "as ``lowercase``", as in HF.
    4. ``lowercase``: character by character (``"Σ"`` is always ``"σ"``, never the final ``"ς"``
       that Python's ``str.lower`` writes at the end of a word).

    The defaults are an uncased BERT's (``bert-base-uncased``, all-MiniLM-L6-v2). Caveat, as in
    :func:`bert_pre_tokenize`: HF classifies characters with older Unicode tables, so the two
    differ on a few hundred marks and format characters assigned since, and on three characters of
    Unicode 3.2 that Unicode later reclassified (U+1734, U+1885, U+1886); they agree on every other
    character of Unicode 3.2, which is what the tests draw from.

    Args:
        clean_text: drop control characters and map whitespace to spaces.
        handle_chinese_chars: surround CJK ideographs with spaces.
        strip_accents: drop accents; ``None``: when ``lowercase``.
        lowercase: lower-case the text.
    """

    def __init__(self, clean_text: bool = True, handle_chinese_chars: bool = True,
                 strip_accents: bool | None = None, lowercase: bool = True):
        for name, value in (("clean_text", clean_text), ("handle_chinese_chars", handle_chinese_chars),
                            ("lowercase", lowercase)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
        if strip_accents is not None and not isinstance(strip_accents, bool):
            raise TypeError(f"strip_accents must be a bool or None, got {type(strip_accents).__name__}")
        self.clean_text = clean_text
        self.handle_chinese_chars = handle_chinese_chars
        self.strip_accents = strip_accents
        self.lowercase = lowercase

    def __repr__(self) -> str:
        return (f"BertNormalizer(clean_text={self.clean_text}, handle_chinese_chars={self.handle_chinese_chars}, "
                f"strip_accents={self.strip_accents}, lowercase={self.lowercase})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BertNormalizer) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))

    def __call__(self, text: str) -> str:
        """The normalised ``text``: ``"Héllo\\tWORLD 北京"`` -> ``"hello world  北  京 "`` (defaults)."""
        text = _check_text(text)
        if self.clean_text:
            text = _WHITESPACE.sub(" ", _BERT_CONTROL.sub("", text))
        if self.handle_chinese_chars:
            text = _CJK.sub(r" \g<0> ", text)
        if self.strip_accents if self.strip_accents is not None else self.lowercase:
            text = _NONSPACING_MARK.sub("", unicodedata.normalize("NFD", text))
        if self.lowercase:
            # str.lower() alone would write a final sigma at the end of words; HF lowers each character.
            text = "".join(map(str.lower, text)) if "\u03a3" in text else text.lower()
        return text

    def to_dict(self) -> dict[str, Any]:
        """The settings, as ``tokenizer.json`` writes them (``{"type": "BertNormalizer", ...}``)."""
        return {"type": "BertNormalizer", "clean_text": self.clean_text,
                "handle_chinese_chars": self.handle_chinese_chars, "strip_accents": self.strip_accents,
                "lowercase": self.lowercase}


def _check_token_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must be a non-empty string")
    return value


class WordPieceTokenizer:
    """WordPiece, BERT's subword tokenizer (Schuster & Nakajima, 2012; Wu et al., 2016; Devlin et al., 2019).

    A token either starts a word (``"read"``) or continues one, in which case it carries the
    ``prefix`` (``"##ing"``). Encoding a string: cut out the special tokens, cut the rest into
    words with :func:`bert_pre_tokenize`, then cut each word greedily, longest match first: the
    longest vocabulary token that starts the word, then the longest ``prefix``-token that
    continues it from there, and so on. If at some point no token matches (a character the
    vocabulary lacks), or the word has more than ``max_input_chars_per_word`` characters, the
    *whole word* becomes ``unk_token``. This is HF ``tokenizers``' ``WordPiece`` model behind a
    ``BertPreTokenizer``, id for id.

    Build one from a vocabulary (BERT's ``vocab.txt`` read as a list), with :meth:`train`, or from
    a pre-trained model's ``tokenizer.json`` with :meth:`from_tokenizer_json`. Given a
    ``normalizer``, each stretch of text between special tokens is normalised before it is cut into
    words (HF's order: special tokens are found in the raw text).

    Args:
        vocab: the tokens in id order, or a mapping from token to id (ids ``0 .. len - 1``).
        unk_token: the token of words that cannot be cut; must be in ``vocab``.
        prefix: the mark of a token that continues a word (``"##"`` in BERT).
        max_input_chars_per_word: longer words become ``unk_token`` (100, as in BERT and HF).
        special_tokens: tokens of ``vocab`` that ``encode`` finds in raw text and never splits
            (``"[CLS]"``, ``"[SEP]"``, ...); the longest wins where two overlap.
        normalizer: a :class:`BertNormalizer` applied before pre-tokenization, or ``None`` (the
            default: the text is used as it is).
    """

    def __init__(
        self,
        vocab: Sequence[str] | Mapping[str, int],
        unk_token: str = "[UNK]",
        prefix: str = "##",
        max_input_chars_per_word: int = 100,
        special_tokens: Iterable[str] = (),
        normalizer: BertNormalizer | None = None,
    ):
        if isinstance(vocab, Mapping):
            items = sorted(vocab.items(), key=lambda kv: kv[1] if isinstance(kv[1], int) else -1)
            ids = [i for _, i in items]
            if any(isinstance(i, bool) or not isinstance(i, int) for i in ids) or ids != list(range(len(ids))):
                raise ValueError("vocab as a mapping must give the ids 0 .. len(vocab) - 1, each once")
            tokens = [t for t, _ in items]
        elif isinstance(vocab, (str, bytes)) or not isinstance(vocab, Iterable):
            raise TypeError(f"vocab must be a list of tokens or a dict token -> id, got {type(vocab).__name__}")
        else:
            tokens = list(vocab)
        for t in tokens:
            if not isinstance(t, str) or not t:
                raise TypeError(f"vocab must hold non-empty strings, got {t!r}")
        if len(set(tokens)) != len(tokens):
            dupes = sorted({t for t in tokens if tokens.count(t) > 1})[:5] if len(tokens) < 10_000 else "some"
            raise ValueError(f"vocab must not repeat a token, got repeats: {dupes}")
        self.itos: list[str] = tokens
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(tokens)}
        self.unk_token = _check_token_str("unk_token", unk_token)
        if unk_token not in self.vocab:
            raise ValueError(f"unk_token {unk_token!r} is not in vocab")
        self.unk_id = self.vocab[unk_token]
        self.prefix = _check_token_str("prefix", prefix)
        self.max_input_chars_per_word = check_int("max_input_chars_per_word", max_input_chars_per_word)
        specials = _check_specials(special_tokens)
        missing = [s for s in specials if s not in self.vocab]
        if missing:
            raise ValueError(f"special_tokens must be tokens of vocab, but {missing} are not")
        self.special_tokens: dict[str, int] = {s: self.vocab[s] for s in specials}
        self._special_regex = _special_splitter(specials)
        if normalizer is not None and not isinstance(normalizer, BertNormalizer):
            raise TypeError(f"normalizer must be a BertNormalizer or None, got {type(normalizer).__name__}")
        self.normalizer = normalizer
        # Longest token in characters, without the prefix: no longer match needs to be tried.
        n = len(prefix)
        self._longest = max((len(t) - n if t.startswith(prefix) else len(t)) for t in tokens)
        self._cache: dict[str, list[int]] = {}

    # -- encoding and decoding ------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of tokens (ids ``0 .. vocab_size - 1``)."""
        return len(self.itos)

    def __repr__(self) -> str:
        return (
            f"WordPieceTokenizer(vocab_size={self.vocab_size}, unk_token={self.unk_token!r}, "
            f"prefix={self.prefix!r}, special_tokens={list(self.special_tokens)}"
            + (f", normalizer={self.normalizer!r})" if self.normalizer else ")")
        )

    def _wordpiece(self, word: str) -> list[int]:
        """Greedy longest-match-first cut of one word into token ids (``[unk_id]`` if impossible)."""
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_id]
        vocab, prefix, longest = self.vocab, self.prefix, self._longest
        ids: list[int] = []
        start, n = 0, len(word)
        while start < n:
            end = min(n, start + longest)
            while end > start:
                piece = word[start:end] if start == 0 else prefix + word[start:end]
                found = vocab.get(piece)
                if found is not None:
                    ids.append(found)
                    break
                end -= 1
            else:
                return [self.unk_id]
            start = end
        return ids

    def _encode_ordinary(self, text: str, ids: list[int]) -> None:
        if self.normalizer is not None:
            text = self.normalizer(text)
        _encode_cached(_BERT_PATTERN.findall(text), self._cache, self._wordpiece, ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens in it become their single ids."""
        return _encode_around_specials(_check_text(text), self._special_regex, self.special_tokens,
                                       self._encode_ordinary)

    def tokenize(self, text: str) -> list[str]:
        """The tokens of ``text`` as strings: ``"unreadable"`` -> ``["un", "##read", "##able"]``."""
        return [self.itos[i] for i in self.encode(text)]

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The text of ``ids``: tokens joined by single spaces, ``prefix``-tokens glued to the one before.

        Word-level whitespace is not stored, so ``decode(encode(text))`` is the words of ``text``
        (:func:`bert_pre_tokenize`) joined by single spaces, if no word became ``unk_token``. As HF's
        ``decoders.WordPiece(cleanup=False)``, a first token that starts with ``prefix`` keeps it.
        """
        ids = _ids_list(ids)
        bad = [i for i in ids if not 0 <= i < len(self.itos)]
        if bad:
            raise ValueError(f"ids must be in [0, {len(self.itos)}), got {bad[:10]}")
        prefix, n = self.prefix, len(self.prefix)
        parts = []
        for k, i in enumerate(ids):
            token = self.itos[i]
            if k == 0:
                parts.append(token)
            elif token.startswith(prefix):
                parts.append(token[n:])
            else:
                parts.append(" " + token)
        return "".join(parts)

    # -- training -------------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        texts: str | Iterable[str],
        vocab_size: int,
        special_tokens: Iterable[str] = BERT_SPECIAL_TOKENS,
        unk_token: str = "[UNK]",
        prefix: str = "##",
        max_input_chars_per_word: int = 100,
        criterion: str = "likelihood",
        progress: bool = False,
    ) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary of ``vocab_size`` tokens from ``texts``.

        The vocabulary starts with ``special_tokens``, then every character of the training words
        in both forms (``"e"`` and ``"##e"``), sorted, so that any word spelled with those
        characters has a tokenization. Every word (:func:`bert_pre_tokenize`) starts cut into
        characters, ``"read"`` -> ``r ##e ##a ##d``. Then, until the vocabulary is full, the adjacent
        pair of units ``(a, b)`` with the best score merges everywhere into one unit (``a`` followed
        by ``b`` without its prefix), which joins the vocabulary. With :math:`c(\\cdot)` the counts
        over all words weighted by their frequency in ``texts`` and :math:`n` the number of units:

        - ``criterion="likelihood"`` (default; Schuster & Nakajima, 2012): the merge that most
          increases the likelihood of the training words under a unigram language model of the
          units, refitted after the merge. With :math:`m = c(ab)` merges and :math:`f(x) = x \\ln x`,
          the log-likelihood changes by

          .. math:: f(c(a) - m) + f(c(b) - m) + f(m) - f(c(a)) - f(c(b)) + f(n) - f(n - m)

          (exactly, when the merged unit is new; for ``a == b`` a run of ``r`` units makes
          ``r // 2`` merges). When :math:`m` is small next to :math:`c(a)` and :math:`c(b)`, this is
          about :math:`m\\,(\\ln \\frac{m\\,n}{c(a)\\,c(b)} - 1)`: the pair count times the log of how
          much more often ``a`` and ``b`` meet than if they were independent, less one.
        - ``criterion="ratio"``: :math:`c(ab) / (c(a)\\,c(b))`, the score of Hugging Face's
          description of WordPiece. Without the factor :math:`m` it favours pairs whose parts are
          rarely seen apart, however rare the pair: names and rare words fill the vocabulary.

        (HF ``tokenizers``' own ``WordPieceTrainer`` runs BPE instead, most frequent pair first.)
        Ties go to the more frequent pair, then to the pair first in string order. Ratios are
        compared exactly, as integers; likelihood gains in steps of 2^-20 nats, so that training
        gives the same vocabulary on every machine.

        Implementation: the unique words weighted by their counts, the words that hold each pair,
        the pairs that hold each unit, and a max-heap of scores. A merge changes the counts of the
        neighbouring pairs and of the units ``a``, ``b`` and the new one, so only the pairs that
        hold those units get a new score. As :math:`n` falls, every likelihood gain falls, so a
        stored gain is an upper bound: the best entry is recomputed before it is taken.

        Args:
            texts: a string or an iterable of strings.
            vocab_size: the size of the vocabulary, special tokens and characters included.
            special_tokens: tokens put first in the vocabulary (ids ``0, 1, ...``) and never split
                by ``encode``; occurrences in ``texts`` are cut out before counting.
            unk_token: one of ``special_tokens``.
            prefix: the continuation mark.
            max_input_chars_per_word: passed to the tokenizer.
            criterion: ``"likelihood"`` or ``"ratio"``, see above.
            progress: show a ``tqdm`` bar over the merges.

        Returns:
            The trained tokenizer (smaller than ``vocab_size`` if the words run out of pairs).
        """
        specials = _check_specials(special_tokens)
        unk_token = _check_token_str("unk_token", unk_token)
        if unk_token not in specials:
            raise ValueError(f"unk_token {unk_token!r} must be one of special_tokens {specials}")
        prefix = _check_token_str("prefix", prefix)
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
            raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
        if criterion not in WORDPIECE_CRITERIA:
            raise ValueError(f"criterion must be one of {WORDPIECE_CRITERIA}, got {criterion!r}")
        word_counts = _count_words(texts, specials)
        tokens = _train_wordpiece(word_counts, vocab_size, specials, prefix, criterion, progress)
        return cls(tokens, unk_token, prefix, max_input_chars_per_word, specials)

    # -- Hugging Face import and export ---------------------------------------------------------

    @classmethod
    def from_tokenizer_json(cls, path: str | os.PathLike) -> WordPieceTokenizer:
        """The tokenizer of a pre-trained BERT, read from its Hugging Face ``tokenizer.json``.

        Reads the ``WordPiece`` model (vocabulary, ``[UNK]``, prefix, longest word), the
        ``BertNormalizer`` settings and the special added tokens; refuses files this class cannot
        reproduce (another model, normaliser or pre-tokenizer) with a ``ValueError``. Needs neither
        ``tokenizers`` nor ``transformers``. ``encode`` then gives HF's ids *without* the
        post-processor's ``[CLS]`` and ``[SEP]``: add them, ``[cls_id, *encode(text), sep_id]``.
        Truncation and padding settings of the file are ignored.
        """
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path} is not a tokenizer.json (not valid JSON: {err})") from err
        model = data.get("model") if isinstance(data, dict) else None
        if not isinstance(model, dict) or model.get("type") != "WordPiece":
            got = model.get("type") if isinstance(model, dict) else None
            raise ValueError(f"{path}: model.type must be 'WordPiece', got {got!r}")
        pre = data.get("pre_tokenizer")
        if not isinstance(pre, dict) or pre.get("type") != "BertPreTokenizer":
            got = pre.get("type") if isinstance(pre, dict) else pre
            raise ValueError(f"{path}: pre_tokenizer must be a 'BertPreTokenizer', got {got!r}")
        norm = data.get("normalizer")
        if norm is not None and (not isinstance(norm, dict) or norm.get("type") != "BertNormalizer"):
            got = norm.get("type") if isinstance(norm, dict) else norm
            raise ValueError(f"{path}: normalizer must be None or a 'BertNormalizer', got {got!r}")
        normalizer = None
        if norm is not None:
            normalizer = BertNormalizer(**{k: norm[k] for k in ("clean_text", "handle_chinese_chars",
                                                                "strip_accents", "lowercase")})
        specials = []
        for added in data.get("added_tokens", []):
            if not added.get("special"):
                continue
            odd = [k for k in ("single_word", "lstrip", "rstrip", "normalized") if added.get(k)]
            if odd:
                raise ValueError(f"{path}: special token {added['content']!r} has {odd} set; only plain "
                                 "special tokens, matched in the raw text, are supported")
            if model["vocab"].get(added["content"]) != added["id"]:
                raise ValueError(f"{path}: special token {added['content']!r} has id {added['id']}, "
                                 f"expected its vocabulary id {model['vocab'].get(added['content'])}")
            specials.append(added["content"])
        return cls(model["vocab"], model["unk_token"], model["continuing_subword_prefix"],
                   model["max_input_chars_per_word"], specials, normalizer)

    def to_hf(self):
        """This tokenizer as a Hugging Face ``tokenizers.Tokenizer``: ``WordPiece`` model,
        ``BertPreTokenizer``, ``WordPiece`` decoder (no clean-up), the special tokens as added
        tokens and the :class:`BertNormalizer`, if any. It encodes every string to the same ids
        (see :func:`bert_pre_tokenize` and :class:`BertNormalizer` for the Unicode caveats) and
        decodes, with ``skip_special_tokens=False``, to the same text."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

        tok = Tokenizer(
            models.WordPiece(
                vocab=dict(self.vocab),
                unk_token=self.unk_token,
                continuing_subword_prefix=self.prefix,
                max_input_chars_per_word=self.max_input_chars_per_word,
            )
        )
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        if self.normalizer is not None:
            settings = self.normalizer.to_dict()
            del settings["type"]
            tok.normalizer = normalizers.BertNormalizer(**settings)
        tok.decoder = decoders.WordPiece(prefix=self.prefix, cleanup=False)
        if self.special_tokens:
            tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in self.special_tokens])
        return tok


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
