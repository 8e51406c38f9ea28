"""Text-to-text tasks (Raffel et al., 2020): every task as ``"prefix: input"`` -> ``"output"``.

T5 casts translation, classification, regression and summarisation into one format: the model
reads a string that starts with a task prefix and writes the answer as a string, so one model,
one loss and one decoding procedure serve them all. This module does the same for the book's
tasks:

* :func:`task_pairs` turns a sequence-to-sequence task of :mod:`companion.tasks` (dates,
  reversal, sorting, …) into ``(source text, target text)`` pairs, e.g.
  ``("date: 2024-03-07", "7 march 2024")``;
* :func:`play_pairs` cuts tasks from Shakespeare's plays: ``"genre: <passage>"`` -> the play's
  genre, ``"continue: <passage>"`` -> the characters that follow it;
* :class:`TextToTextTokenizer` is a character-level tokenizer whose vocabulary also holds T5's
  special tokens — ``<pad>`` (0, also the decoder's start token), ``</s>`` (1), ``<unk>`` (2), the
  sentinels ``<extra_id_0>``, ``<extra_id_1>``, … of span corruption
  (:func:`companion.objectives.span_corrupt`) — and one token per task prefix;
* :func:`encode_pairs` makes padded ``(src, tgt)`` batches in the layout
  :func:`companion.training.teacher_forcing_loss` and :func:`companion.generation.greedy_decode`
  expect: ``src = input </s> <pad>…``, ``tgt = <pad> output </s> <pad>…``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import torch

from companion._validation import check_int
from companion.tasks import DateTask, Seq2SeqTask, pad_sequences

__all__ = ["PAD", "EOS", "UNK", "sentinel", "TextToTextTokenizer", "task_pairs", "play_pairs", "encode_pairs",
           "exact_match"]

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"


def sentinel(i: int) -> str:
    """The ``i``-th sentinel token, T5's spelling: ``sentinel(0) == "<extra_id_0>"``."""
    check_int("i", i, 0)
    return f"<extra_id_{i}>"


class TextToTextTokenizer:
    """Characters plus T5's special tokens, sentinels and task prefixes.

    Ids: ``<pad>`` = 0, ``</s>`` = 1, ``<unk>`` = 2, then ``n_sentinels`` sentinels, then one
    token per prefix (``"date"`` becomes the token ``"date:"``), then the characters in sorted
    order. A special token or prefix in the text is one id; every other character is one id
    (``<unk>`` if it is not in the vocabulary). A prefix is recognised wherever ``"name:"``
    appears, not only at the start: ``"a sort: b"`` holds the ``"sort:"`` token, so texts that may
    contain a prefix's spelling (a passage quoting ``"sort:"``) should use names they cannot hold.

    Args:
        chars: the characters to know (a string or an iterable of single characters; duplicates
            are ignored).
        prefixes: task names, each written ``"name:"`` at the start of a source text.
        n_sentinels: how many sentinels (span corruption needs one per span).
    """

    pad_id, eos_id, unk_id = 0, 1, 2

    def __init__(self, chars: str | Iterable[str], prefixes: Sequence[str] = (), n_sentinels: int = 16) -> None:
        check_int("n_sentinels", n_sentinels, 0)
        chars = sorted(set(chars))
        if not chars or any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise ValueError("chars must hold at least one character, each a single-character string")
        if isinstance(prefixes, str):
            raise TypeError("prefixes must be a sequence of task names, not one string")
        prefixes = list(prefixes)
        if len(set(prefixes)) != len(prefixes) or any(
                not isinstance(p, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_ ]*", p) for p in prefixes):
            raise ValueError(f"prefixes must be distinct names of letters, digits, '_' and spaces, got {prefixes!r}")
        self.prefixes = prefixes
        self.specials = [PAD, EOS, UNK] + [sentinel(i) for i in range(n_sentinels)] + [f"{p}:" for p in prefixes]
        self.itos: list[str] = self.specials + chars
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        self.sentinel_ids = [self.stoi[sentinel(i)] for i in range(n_sentinels)]
        self._special_set = set(self.specials)
        # the longest special first, so that "<extra_id_10>" is not read as "<extra_id_1>" + "0>"
        self._split = re.compile("(" + "|".join(re.escape(s) for s in sorted(self.specials, key=len,
                                                                             reverse=True)) + ")")

    def __len__(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return (f"TextToTextTokenizer(size={len(self)}, sentinels={len(self.sentinel_ids)}, "
                f"prefixes={self.prefixes!r})")

    def prefix_id(self, name: str) -> int:
        """The id of the prefix token ``"name:"``."""
        if name not in self.prefixes:
            raise ValueError(f"name must be one of the prefixes {self.prefixes!r}, got {name!r}")
        return self.stoi[f"{name}:"]

    def encode(self, text: str, eos: bool = False) -> list[int]:
        """Ids of ``text`` (``+ [</s>]`` if ``eos``): one per special token or prefix, one per other character."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self._special_set:
                ids.append(self.stoi[piece])
            else:
                ids.extend(self.stoi.get(c, self.unk_id) for c in piece)
        return ids + [self.eos_id] if eos else ids

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special: bool = True) -> str:
        """The text of ``ids``, up to the first ``</s>``; ``skip_special`` drops ``<pad>`` (and ``</s>``)."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        bad = [i for i in ids if not (isinstance(i, int) and 0 <= i < len(self))]
        if bad:
            raise ValueError(f"ids must be ints in [0, {len(self)}), got {bad[:5]}")
        out = []
        for i in ids:
            if i == self.eos_id:
                if not skip_special:
                    out.append(EOS)
                break
            if i == self.pad_id and skip_special:
                continue
            out.append(self.itos[i])
        return "".join(out)


def _render(task: Seq2SeqTask, tokens: list[str], side: str) -> str:
    if isinstance(task, DateTask) and side == "target":  # day, month, then the year's digits
        return f"{tokens[0]} {tokens[1]} {''.join(tokens[2:])}"
    return ("" if all(len(t) == 1 for t in tokens) else " ").join(tokens)


def task_pairs(task: Seq2SeqTask, n: int, generator: torch.Generator | None = None, split: str = "train",
               prefix: str | None = None) -> list[tuple[str, str]]:
    """``n`` examples of a :mod:`companion.tasks` task as text: ``("prefix: input", "output")``.

    Args:
        task: e.g. :class:`~companion.tasks.DateTask` (``"date: 2024-03-07"`` -> ``"7 march 2024"``)
            or :class:`~companion.tasks.ReverseTask` (``"reverse: acb"`` -> ``"bca"``).
        n, generator, split: as :meth:`~companion.tasks.Seq2SeqTask.pairs` (held-out inputs are in
            ``"test"`` only).
        prefix: the task prefix (default ``task.name``); ``""`` writes the input alone.
    """
    if not isinstance(task, Seq2SeqTask):
        raise TypeError(f"task must be a companion.tasks.Seq2SeqTask, got {type(task).__name__}")
    prefix = task.name if prefix is None else prefix
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str or None, got {type(prefix).__name__}")
    head = f"{prefix}: " if prefix else ""
    return [(head + _render(task, s, "source"), _render(task, t, "target")) for s, t in task.pairs(n, generator, split)]


def play_pairs(texts: Sequence[str], labels: Sequence[str], n: int, *, task: str = "genre", window: int = 48,
               target_len: int = 16, generator: torch.Generator | None = None) -> list[tuple[str, str]]:
    """``n`` text-to-text examples cut from plays: a random passage of ``window`` characters each.

    Args:
        texts: one string per play (e.g. ``shakespeare_corpus()["text"]``).
        labels: one label per play (e.g. its ``"genre"``).
        task: ``"genre"`` -> ``("genre: <passage>", <label of its play>)``; ``"continue"`` ->
            ``("continue: <passage>", <the next target_len characters>)``.
        window, target_len: passage and continuation lengths in characters.
        generator: a seeded generator; a play is drawn uniformly, then a position in it.
    """
    check_int("n", n)
    check_int("window", window)
    check_int("target_len", target_len)
    if task not in ("genre", "continue"):
        raise ValueError(f"task must be 'genre' or 'continue', got {task!r}")
    texts, labels = list(texts), list(labels)
    if not texts or len(texts) != len(labels):
        raise ValueError(f"texts and labels must be non-empty and of one length, got {len(texts)} and {len(labels)}")
    need = window + target_len
    if any(len(t) < need + 1 for t in texts):
        raise ValueError(f"every text must hold more than window + target_len = {need} characters")
    plays = torch.randint(len(texts), (n,), generator=generator).tolist()
    out = []
    for p in plays:
        text = texts[p]
        start = int(torch.randint(len(text) - need, (1,), generator=generator))
        passage = text[start:start + window]
        if task == "genre":
            out.append((f"genre: {passage}", labels[p]))
        else:
            out.append((f"continue: {passage}", text[start + window:start + need]))
    return out


def encode_pairs(tokenizer: TextToTextTokenizer, pairs: Sequence[tuple[str, str]], *,
                 max_source_len: int | None = None, max_target_len: int | None = None) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """Padded ``(src (n, src_len), tgt (n, tgt_len))`` int64 batches for an encoder-decoder.

    ``src`` is ``input </s>``; ``tgt`` is ``<pad> output </s>`` — T5 starts decoding from the padding
    id — both right-padded with ``<pad>``. ``max_source_len`` / ``max_target_len`` cut the text
    (before ``</s>``) so that each row holds at most that many ids.
    """
    if not isinstance(tokenizer, TextToTextTokenizer):
        raise TypeError(f"tokenizer must be a TextToTextTokenizer, got {type(tokenizer).__name__}")
    if not pairs:
        raise ValueError("pairs must hold at least one (source, target) pair")
    for name, value in (("max_source_len", max_source_len), ("max_target_len", max_target_len)):
        if value is not None:
            check_int(name, value, 2)
    srcs, tgts = [], []
    for source, target in pairs:
        s, t = tokenizer.encode(source), tokenizer.encode(target)
        if max_source_len is not None:
            s = s[: max_source_len - 1]
        if max_target_len is not None:
            t = t[: max_target_len - 2]
        srcs.append(s + [tokenizer.eos_id])
        tgts.append([tokenizer.pad_id] + t + [tokenizer.eos_id])
    return pad_sequences(srcs, tokenizer.pad_id), pad_sequences(tgts, tokenizer.pad_id)


def exact_match(tokenizer: TextToTextTokenizer, generated: torch.Tensor, targets: Sequence[str]) -> float:
    """Share of rows of ``generated`` ``(n, len)`` (e.g. from ``greedy_decode``) whose text equals its target."""
    if not isinstance(generated, torch.Tensor) or generated.dim() != 2:
        raise ValueError("generated must be a 2-D tensor of ids (n, len)")
    if len(targets) != generated.shape[0]:
        raise ValueError(f"targets must hold one string per row ({generated.shape[0]}), got {len(targets)}")
    hits = sum(tokenizer.decode(row) == t for row, t in zip(generated, targets))
    return hits / len(targets)
