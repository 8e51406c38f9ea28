"""Pre-training objectives of the three families, beyond next-token prediction.

* **Masked language modelling** (BERT, Devlin et al., 2019): :func:`mlm_mask` picks 15% of the
  tokens to predict and corrupts the input there — 80% become ``[MASK]``, 10% a random token,
  10% stay — so the model cannot tell which inputs are real. Called once per example, it gives
  BERT's *static* masking; called afresh every epoch, RoBERTa's *dynamic* masking (Liu et al.,
  2019). ``word_ids`` masks whole words instead of word pieces.
* **Next-sentence prediction** (BERT): :func:`nsp_pairs` makes passage pairs, half consecutive,
  half random; :func:`pack_pair` lays a pair out as ``[CLS] A [SEP] B [SEP]`` with segment ids.
* **Span corruption** (T5, Raffel et al., 2020): :func:`span_corrupt` drops random spans (15% of
  the tokens, mean length 3), puts one sentinel per span in the input, and asks for the spans
  after their sentinels — targets much shorter than the input; :func:`t5_lengths` sizes the raw
  text for a given input length, as T5 does. :func:`iid_corrupt` is the paper's i.i.d. arm:
  each token corrupted independently, each run of corrupted tokens written as one span.
* **Distillation** (DistilBERT, Sanh et al., 2019; Hinton et al., 2015): :func:`distillation_loss`
  combines the teacher's softened predictions, the MLM loss and the alignment of hidden states.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from companion._validation import check_int

__all__ = ["mlm_mask", "nsp_pairs", "pack_pair", "span_corrupt", "iid_corrupt", "t5_lengths", "distillation_loss"]

IGNORE = -100  # label of a position that is not predicted (PyTorch's cross-entropy default)


def _check_ids(name: str, ids: object, dims: int = 2) -> Tensor:
    if not isinstance(ids, Tensor) or ids.dim() != dims or ids.is_floating_point() or ids.dtype == torch.bool:
        got = f"shape {tuple(ids.shape)}, dtype {ids.dtype}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be an integer tensor with {dims} dims, got {got}")
    return ids


def mlm_mask(ids: Tensor, *, vocab_size: int, mask_id: int, special_ids: Iterable[int], mask_prob: float = 0.15,
             ratios: tuple[float, float, float] = (0.8, 0.1, 0.1), word_ids: Tensor | None = None,
             generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """BERT's masking: choose positions to predict and corrupt the input there.

    Args:
        ids: token ids ``(batch, seq)``.
        vocab_size: ids are in ``[0, vocab_size)``.
        mask_id: the ``[MASK]`` token.
        special_ids: ids never chosen and never used as random replacements (``[CLS]``, ``[SEP]``,
            padding, ``[MASK]``…).
        mask_prob: the chance that a position (or, with ``word_ids``, a whole word) is chosen.
        ratios: of the chosen positions, the shares replaced by ``[MASK]``, by a random
            non-special token, and left unchanged (they sum to 1).
        word_ids: ``(batch, seq)`` index of the word each token belongs to (−1 for specials):
            whole-word masking chooses words, then masks all their pieces.
        generator: a seeded generator, for reproducible masks.

    Returns:
        ``(inputs, labels)``: the corrupted ids, and the original ids at the chosen positions with
        −100 (ignored by the loss) everywhere else.
    """
    ids = _check_ids("ids", ids)
    check_int("vocab_size", vocab_size, 2)
    specials = sorted(set(int(s) for s in special_ids) | {int(mask_id)})
    if not 0 < mask_prob < 1:
        raise ValueError(f"mask_prob must be in (0, 1), got {mask_prob!r}")
    if len(ratios) != 3 or min(ratios) < 0 or not math.isclose(sum(ratios), 1.0, abs_tol=1e-6):
        raise ValueError(f"ratios must be three non-negative shares summing to 1, got {ratios!r}")
    special = torch.isin(ids, torch.tensor(specials, device=ids.device))

    def uniform(shape: torch.Size) -> Tensor:
        return torch.rand(shape, generator=generator, device="cpu").to(ids.device)

    if word_ids is None:
        chosen = (uniform(ids.shape) < mask_prob) & ~special
    else:
        word_ids = _check_ids("word_ids", word_ids)
        if word_ids.shape != ids.shape:
            raise ValueError(f"word_ids must have the shape of ids {tuple(ids.shape)}, got {tuple(word_ids.shape)}")
        n_words = int(word_ids.max()) + 1 if word_ids.numel() else 0
        picked = uniform((ids.shape[0], max(n_words, 1))) < mask_prob  # one draw per word
        chosen = picked.gather(1, word_ids.clamp(min=0)) & (word_ids >= 0) & ~special
    labels = ids.masked_fill(~chosen, IGNORE)
    r = uniform(ids.shape)
    to_mask = chosen & (r < ratios[0])
    to_random = chosen & (r >= ratios[0]) & (r < ratios[0] + ratios[1])
    keep = torch.ones(vocab_size, dtype=torch.bool)
    keep[[s for s in specials if 0 <= s < vocab_size]] = False
    allowed = keep.nonzero().squeeze(1).to(ids.device)  # the non-special ids, in order
    random_ids = allowed[torch.randint(len(allowed), ids.shape, generator=generator).to(ids.device)]
    inputs = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    inputs = torch.where(to_random, random_ids, inputs)
    return inputs, labels


def nsp_pairs(passages: Sequence[Sequence[int]], n: int,
              generator: torch.Generator | None = None) -> list[tuple[list[int], list[int], int]]:
    """``n`` next-sentence examples ``(a, b, label)`` from an ordered list of passages.

    ``a`` is a random passage; with probability 1/2, ``b`` is the passage that follows it
    (``label`` 0, "is next", as in BERT and HF), otherwise a random passage that does not follow
    it (``label`` 1).
    """
    check_int("n", n)
    if len(passages) < 3:
        raise ValueError(f"passages must hold at least 3 passages, got {len(passages)}")
    out = []
    for _ in range(n):
        i = int(torch.randint(len(passages) - 1, (1,), generator=generator))
        if float(torch.rand(1, generator=generator)) < 0.5:
            out.append((list(passages[i]), list(passages[i + 1]), 0))
        else:
            j = int(torch.randint(len(passages) - 2, (1,), generator=generator))
            j = j if j < i + 1 else j + 1  # any passage but i + 1 (b may not follow a)
            j = j if j != i else (j + 2) % len(passages)
            out.append((list(passages[i]), list(passages[j]), 1))
    return out


def pack_pair(a: Sequence[int], b: Sequence[int], *, cls_id: int, sep_id: int, max_len: int,
              generator: torch.Generator | None = None) -> tuple[list[int], list[int]]:
    """``[CLS] a [SEP] b [SEP]`` and its segment ids (0 for A, 1 for B), trimmed to ``max_len``.

    Trimming removes one token at a time from the longer segment until the pair fits. Without a
    ``generator`` each token comes off the segment's end, as BERT's fine-tuning code does
    (``_truncate_seq_pair`` in ``run_classifier.py``), except that a tie shortens ``a`` here (``b``
    there). With a ``generator``, as BERT's pre-training data (``truncate_seq_pair`` in
    ``create_pretraining_data.py``): a tie shortens ``b``, and each token comes off the front or the
    end with probability 1/2, "to add more randomness and avoid biases".
    """
    check_int("max_len", max_len, 5)
    a, b = list(a), list(b)
    while len(a) + len(b) > max_len - 3:
        if generator is None:
            (a if len(a) >= len(b) else b).pop()
        else:
            longer = a if len(a) > len(b) else b
            longer.pop(0 if torch.rand((), generator=generator) < 0.5 else -1)
    ids = [cls_id, *a, sep_id, *b, sep_id]
    return ids, [0] * (len(a) + 2) + [1] * (len(b) + 1)


def _random_segmentation(n_items: int, n_segments: int, generator: torch.Generator | None) -> Tensor:
    """Split ``n_items`` into ``n_segments`` positive lengths, uniformly at random (T5's algorithm)."""
    first = torch.zeros(n_items, dtype=torch.long)
    cuts = torch.randperm(n_items - 1, generator=generator)[: n_segments - 1] + 1
    first[cuts] = 1
    segment = first.cumsum(0)
    return torch.bincount(segment, minlength=n_segments)


def _noise_mask(length: int, noise_density: float, mean_span_length: float,
                generator: torch.Generator | None) -> Tensor:
    """T5's ``random_spans_noise_mask``: True at corrupted positions; spans alternate, clean first."""
    n_noise = min(max(round(length * noise_density), 1), length - 1)
    # at least one span, and no more than either part can split into (T5 does not cap this; it
    # only matters for sequences of a few tokens, where two spans would otherwise touch)
    n_spans = min(max(round(n_noise / mean_span_length), 1), n_noise, length - n_noise)
    noise_lengths = _random_segmentation(n_noise, n_spans, generator)
    clean_lengths = _random_segmentation(length - n_noise, n_spans, generator)
    interleaved = torch.stack([clean_lengths, noise_lengths], dim=1).flatten()
    span_of = torch.repeat_interleave(torch.arange(2 * n_spans), interleaved)
    return span_of % 2 == 1


def _write_spans(row: Tensor, noise: Tensor, sentinels: Tensor) -> tuple[Tensor, Tensor]:
    """One row ``(seq,)`` written as T5 writes it: each run of ``noise`` (``(seq,)`` bool) becomes
    ``sentinels[i]`` in the input, and the target lists run ``i`` after that sentinel."""
    starts = noise & ~torch.cat([noise.new_zeros(1), noise[:-1]])  # the first token of each span
    n_spans = int(starts.sum())
    if n_spans > len(sentinels):
        raise ValueError(f"sentinel_ids holds {len(sentinels)} sentinels, {n_spans} spans need one each")
    if n_spans == 0:
        return row.clone(), row[:0].clone()
    span = starts.cumsum(0) - 1  # which span each position belongs to (where noise)
    marks = sentinels.to(row.device)[span.clamp(min=0)]
    row_in = torch.where(starts, marks, row)[~noise | starts]  # clean tokens, a sentinel per span
    # In the target, span i is preceded by its sentinel: a noise token t sits after the noise
    # tokens before it and the i + 1 sentinels of spans 0..i; sentinel i after the noise before span i.
    noise_before = noise.long().cumsum(0) - noise.long()
    target = torch.empty(int(noise.sum()) + n_spans, dtype=row.dtype, device=row.device)
    target[(noise_before + span + 1)[noise]] = row[noise]
    target[(noise_before + span)[starts]] = sentinels.to(row.device)[:n_spans]
    return row_in, target


def span_corrupt(ids: Tensor, *, noise_density: float = 0.15, mean_span_length: float = 3.0,
                 sentinel_ids: Sequence[int], eos_id: int | None = None,
                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """T5's span corruption of each row of ``ids`` ``(batch, seq)``.

    ``round(seq · noise_density)`` tokens in ``round(noise / mean_span_length)`` spans are
    corrupted (the same counts for every row, so the outputs are rectangular); span ``i`` is
    replaced by ``sentinel_ids[i]`` in the input, and the target lists each span after its
    sentinel::

        ids:     The cat sat on the mat today
        inputs:  The cat <s0> the mat <s1>
        targets: <s0> sat on <s1> today

    Args:
        ids: token ids ``(batch, seq)``, ``seq >= 2``.
        noise_density, mean_span_length: T5 uses 0.15 and 3.
        sentinel_ids: the sentinel tokens, in order (T5: ``<extra_id_0>``, ``<extra_id_1>``, …);
            at least as many as there are spans.
        eos_id: appended to both inputs and targets if given.
        generator: a seeded generator, for reproducible corruption.

    Returns:
        ``(inputs, targets)``; putting each target span back in place of its sentinel gives ``ids``.
    """
    ids = _check_ids("ids", ids)
    if ids.shape[1] < 2:
        raise ValueError(f"ids must hold at least 2 tokens per row, got shape {tuple(ids.shape)}")
    if not 0 < noise_density < 1:
        raise ValueError(f"noise_density must be in (0, 1), got {noise_density!r}")
    if not mean_span_length >= 1:
        raise ValueError(f"mean_span_length must be >= 1, got {mean_span_length!r}")
    sentinels = torch.as_tensor(list(sentinel_ids), dtype=ids.dtype)
    inputs, targets = [], []
    for row in ids:
        noise = _noise_mask(row.numel(), noise_density, mean_span_length, generator).to(row.device)
        row_in, row_tgt = _write_spans(row, noise, sentinels)
        inputs.append(row_in)
        targets.append(row_tgt)
    inputs_t, targets_t = torch.stack(inputs), torch.stack(targets)
    if eos_id is not None:
        eos = torch.full((ids.shape[0], 1), eos_id, dtype=ids.dtype, device=ids.device)
        inputs_t, targets_t = torch.cat([inputs_t, eos], 1), torch.cat([targets_t, eos], 1)
    return inputs_t, targets_t


def iid_corrupt(ids: Tensor, *, noise_density: float = 0.15, sentinel_ids: Sequence[int], eos_id: int | None = None,
                pad_id: int = 0, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """T5's i.i.d. denoising of each row of ``ids`` ``(batch, seq)``: BERT-style masking written as spans.

    Each token is corrupted independently with probability ``noise_density`` (Raffel et al., 2020,
    §3.3, the "i.i.d. noise, replace spans" objective of their Table 3), so the corrupted fraction is
    ``noise_density`` only on average. Each run of consecutive corrupted tokens is then written as
    :func:`span_corrupt` writes a span: run ``i`` becomes ``sentinel_ids[i]`` in the input, and the
    target lists each run after its sentinel::

        ids:     The cat sat on the mat today
        noise:   .   .   x   x  .   .   x
        inputs:  The cat <s0> the mat <s1>
        targets: <s0> sat on <s1> today

    At density ``p`` a run starts wherever a token is corrupted and its left neighbour is not,
    about ``seq · p · (1 − p)`` times per row, so the target holds nearly one sentinel per corrupted
    token (runs of mean length ``1 / (1 − p)``), where span corruption needs one per ``mean_span_length``.

    Args:
        ids: token ids ``(batch, seq)``, ``seq >= 1``.
        noise_density: the chance that a token is corrupted, in ``(0, 1)``.
        sentinel_ids: the sentinel tokens, in order (T5: ``<extra_id_0>`` = 32099, ``<extra_id_1>``
            = 32098, …, i.e. ``range(32099, 31999, -1)``); at least as many as the runs of any row.
        eos_id: appended to both inputs and targets if given.
        pad_id: rows differ in length, so inputs and targets are right-padded with it (T5: 0).
        generator: a seeded generator, for reproducible corruption; the noise is one
            ``torch.rand((batch, seq), generator=generator)`` draw on the CPU.

    Returns:
        ``(inputs, targets)``, ``(batch, longest input)`` and ``(batch, longest target)``, padded with
        ``pad_id`` after ``eos_id``; putting each target run back in place of its sentinel gives ``ids``.
    """
    ids = _check_ids("ids", ids)
    if ids.shape[1] < 1:
        raise ValueError(f"ids must hold at least 1 token per row, got shape {tuple(ids.shape)}")
    if not 0 < noise_density < 1:
        raise ValueError(f"noise_density must be in (0, 1), got {noise_density!r}")
    sentinels = torch.as_tensor(list(sentinel_ids), dtype=ids.dtype)
    noise = torch.rand(ids.shape, generator=generator, device="cpu").to(ids.device) < noise_density
    eos = [] if eos_id is None else [torch.tensor([eos_id], dtype=ids.dtype, device=ids.device)]
    inputs, targets = [], []
    for row, row_noise in zip(ids, noise):
        row_in, row_tgt = _write_spans(row, row_noise, sentinels)
        inputs.append(torch.cat([row_in, *eos]))
        targets.append(torch.cat([row_tgt, *eos]))
    return pad_sequence(inputs, batch_first=True, padding_value=pad_id), pad_sequence(
        targets, batch_first=True, padding_value=pad_id)


def t5_lengths(inputs_length: int, noise_density: float = 0.15, mean_span_length: float = 3.0) -> tuple[int, int]:
    """How many raw tokens to corrupt so that the input has ``inputs_length`` tokens (T5's
    ``compute_input_and_target_lengths``).

    Inputs hold the clean tokens, one sentinel per span and an end token; targets the noise
    tokens, one sentinel per span and an end token. Returns ``(raw_tokens, targets_length)``:
    ``t5_lengths(512) == (568, 114)``.
    """
    check_int("inputs_length", inputs_length, 2)

    def lengths(tokens: int) -> tuple[int, int]:
        n_noise = int(round(tokens * noise_density))
        n_spans = int(round(n_noise / mean_span_length))
        return tokens - n_noise + n_spans + 1, n_noise + n_spans + 1

    tokens = inputs_length - 1
    while lengths(tokens + 1)[0] <= inputs_length:
        tokens += 1
    inputs, targets = lengths(tokens)
    if noise_density == 0.5 and targets > inputs:
        tokens, targets = tokens - 1, targets - 1
    return tokens, targets


def distillation_loss(student_logits: Tensor, teacher_logits: Tensor, labels: Tensor, *,
                      student_hidden: Tensor | None = None, teacher_hidden: Tensor | None = None,
                      attention_mask: Tensor | None = None, temperature: float = 2.0, alpha: float = 5.0,
                      beta: float = 2.0, gamma: float = 1.0) -> Tensor:
    """DistilBERT's loss: ``α·T²·KL(p_teacher^T ‖ p_student^T) + β·MLM + γ·(1 − cos(h_s, h_t))``.

    The teacher's predictions softened by the temperature ``T`` carry what it knows about
    *similar* tokens ("dark knowledge", Hinton et al., 2015); ``T²`` keeps that term's gradient
    scale independent of ``T``. The defaults are Sanh et al.'s (T = 2, α = 5, β = 2, γ = 1).

    Args:
        student_logits, teacher_logits: MLM logits ``(batch, seq, vocab)``.
        labels: MLM labels ``(batch, seq)``, −100 where nothing is predicted.
        student_hidden, teacher_hidden: last hidden states ``(batch, seq, d_model)``, for the
            cosine term (skipped if either is None).
        attention_mask: 1 at real tokens ``(batch, seq)``; the KL and cosine terms average over
            them (default: every position).
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student and teacher logits must have one shape, got {tuple(student_logits.shape)} and "
                         f"{tuple(teacher_logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    real = (torch.ones(student_logits.shape[:-1], dtype=torch.bool, device=student_logits.device)
            if attention_mask is None else attention_mask.bool())
    s, t = student_logits[real] / temperature, teacher_logits[real].detach() / temperature
    kl = F.kl_div(s.log_softmax(-1), t.log_softmax(-1), log_target=True, reduction="batchmean")
    loss = alpha * temperature**2 * kl
    loss = loss + beta * F.cross_entropy(student_logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE)
    if student_hidden is not None and teacher_hidden is not None:
        cos = F.cosine_similarity(student_hidden[real], teacher_hidden[real].detach(), dim=-1)
        loss = loss + gamma * (1 - cos).mean()
    return loss
