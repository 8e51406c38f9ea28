"""The incremental byte-level BPE trainer behind :meth:`~companion.tokenization.BPETokenizer.train`.

It reproduces Hugging Face ``tokenizers``' ``BpeTrainer`` merge for merge, ties included (the
algorithm and the tie-breaking rule are described in :meth:`~companion.tokenization.BPETokenizer.train`).
``_count_chunks`` counts the pre-tokenized chunks of a corpus, ``_train_fast`` learns the merges,
and ``_dedupe_keep_last`` turns the merge record into the merges as HF stores them. The textbook
trainer, :func:`~companion.tokenization.train_bpe_naive`, lives with the tokenizer in
:mod:`companion.tokenization.bpe`. Nothing here is public.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence

import regex

from companion.tokenization._common import _MASK, _SHIFT, _iter_texts, _special_splitter
from companion.tokenization.pre_tokenization import _HF_BYTE_RANK
from companion.utils import progress as progress_bar

__all__: list[str] = []


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
