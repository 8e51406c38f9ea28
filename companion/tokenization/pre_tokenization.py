"""Pre-tokenization and normalisation: what happens to text before a tokenizer cuts it into tokens.

- The regex patterns that cut text into chunks for byte-level BPE (:data:`GPT2_PATTERN`,
  :data:`GPT4_PATTERN`, :data:`PATTERNS`), and :func:`split_words`, the word splitter of
  :class:`~companion.tokenization.WordTokenizer`.
- GPT-2's byte-to-character map (:func:`bytes_to_unicode`), with which byte-level tokens are
  written in ``tokenizer.json``, and HF's numbering of the 256 byte tokens (for tie-breaking).
- BERT's pre-tokenizer (:func:`bert_pre_tokenize`) and normaliser (:class:`BertNormalizer`), as
  Hugging Face ``tokenizers`` implements them, for :class:`~companion.tokenization.WordPieceTokenizer`.
"""

from __future__ import annotations

import string
import unicodedata
from typing import Any

import regex

from companion.tokenization._common import _check_text

__all__ = [
    "GPT2_PATTERN",
    "GPT4_PATTERN",
    "PATTERNS",
    "bytes_to_unicode",
    "split_words",
    "bert_pre_tokenize",
    "BertNormalizer",
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


def _resolve_pattern(pattern: str) -> str:
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be 'gpt2', 'gpt4' or a regex string, got {type(pattern).__name__}")
    pattern = PATTERNS.get(pattern, pattern)
    try:
        regex.compile(pattern)
    except regex.error as err:
        raise ValueError(f"pattern is not a valid regex: {err}") from err
    return pattern


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
