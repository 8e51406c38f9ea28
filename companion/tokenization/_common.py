"""Helpers shared by the tokenizers of :mod:`companion.tokenization`: input checks, special tokens, encoding.

- ``_check_text`` and ``_ids_list`` check the arguments of ``encode`` and ``decode``;
- ``_check_specials``, ``_special_splitter`` and ``_encode_around_specials`` find special tokens in
  raw text and encode the stretches between them;
- ``_encode_cached`` remembers the ids of each distinct pre-tokenized piece;
- ``_iter_texts`` reads a training corpus given as a string or an iterable of strings;
- ``_SHIFT`` and ``_MASK`` pack a pair of token ids into one int (both trainers use it).

Nothing here is public.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import regex
import torch

__all__: list[str] = []


_SHIFT = 24  # pair (a, b) is stored as the int a << 24 | b: ints hash faster than tuples
_MASK = (1 << _SHIFT) - 1


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
