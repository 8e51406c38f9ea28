"""Byte-level Byte-Pair Encoding: :class:`BPETokenizer` and the textbook trainer :func:`train_bpe_naive`.

:class:`BPETokenizer` encodes and decodes (GPT-2's byte-level BPE), trains with the incremental
trainer of :mod:`companion.tokenization.bpe_training` (:meth:`BPETokenizer.train`, at parity with
Hugging Face's ``BpeTrainer``), saves and loads itself as JSON and exports a Hugging Face
``tokenizers.Tokenizer`` (:meth:`BPETokenizer.to_hf`). :func:`train_bpe_naive` recounts the whole
corpus at every merge: the baseline of ``benchmarks/bpe.py``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import regex
import torch

from companion.tokenization._common import (
    _check_specials,
    _check_text,
    _encode_around_specials,
    _encode_cached,
    _ids_list,
    _iter_texts,
    _special_splitter,
)
from companion.tokenization.bpe_training import _count_chunks, _dedupe_keep_last, _train_fast
from companion.tokenization.pre_tokenization import (
    _HF_BYTE_RANK,
    GPT2_PATTERN,
    PATTERNS,
    _from_unicode,
    _resolve_pattern,
    _to_unicode,
)
from companion.utils import progress as progress_bar

__all__ = ["BPETokenizer", "train_bpe_naive"]


_FORMAT = "companion.BPETokenizer"


def _check_vocab_size(vocab_size: Any, n_special: int) -> int:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
    if vocab_size < 256 + n_special:
        raise ValueError(
            f"vocab_size must be at least 256 (the bytes) + {n_special} (special tokens) = "
            f"{256 + n_special}, got {vocab_size}"
        )
    return vocab_size


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
