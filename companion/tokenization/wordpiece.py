"""WordPiece, BERT's subword tokenizer: :class:`WordPieceTokenizer` and :data:`BERT_SPECIAL_TOKENS`.

Encoding cuts each word (:func:`~companion.tokenization.bert_pre_tokenize`) greedily into the
longest vocabulary pieces, as Hugging Face's ``WordPiece`` model does; training
(:meth:`WordPieceTokenizer.train`) runs the trainer of :mod:`companion.tokenization.wordpiece_training`;
:meth:`WordPieceTokenizer.from_tokenizer_json` reads a pre-trained BERT's ``tokenizer.json`` and
:meth:`WordPieceTokenizer.to_hf` exports a ``tokenizers.Tokenizer``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from companion._validation import check_int
from companion.tokenization._common import (
    _check_specials,
    _check_text,
    _encode_around_specials,
    _encode_cached,
    _ids_list,
    _special_splitter,
)
from companion.tokenization.pre_tokenization import _BERT_PATTERN, BertNormalizer
from companion.tokenization.wordpiece_training import WORDPIECE_CRITERIA, _count_words, _train_wordpiece

__all__ = ["BERT_SPECIAL_TOKENS", "WordPieceTokenizer"]


BERT_SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


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
