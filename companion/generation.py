"""Generating text: sampling from a decoder-only model, greedy and beam search for encoder-decoders.

A language model gives a distribution over the next token; generation turns it into a choice,
appends it and repeats. :func:`sampling_probs` is that choice's distribution, a pure function of
the logits:

* ``temperature`` divides the logits (``T → 0``: greedy, the argmax; ``T = 1``: the model's own
  distribution; ``T > 1``: flatter);
* ``top_k`` keeps the ``k`` most probable tokens (Fan et al., 2018);
* ``top_p`` keeps the smallest set of most probable tokens whose probability reaches ``p``
  (nucleus sampling, Holtzman et al., 2020).

:func:`generate` samples from a :class:`~companion.models.gpt.GPT` with a KV cache: the prompt
is run once, then each step runs the model on the one new token. :func:`greedy_decode` and
:func:`beam_search` do the same for a :class:`~companion.models.transformer.Transformer`,
caching the decoder's self-attention and (computed once from the encoder output) its
cross-attention keys and values. Every function takes ``use_cache=False`` to recompute the
whole prefix at each step instead — the same tokens, more work — which the tests and Chapter 11
compare against.

Prompts of different lengths are batched by **left padding** (:func:`pad_prompts`), as inference
servers do: every row's last prompt token sits in the last column, so each step appends one
column for the whole batch. The ``attention_mask`` (1 at tokens, 0 at padding) hides the padded
keys at every step, the cached ones included, and each row's positions count its own tokens
only, ``p_t = (Σ_{s ≤ t} mask_s) − 1``, so a prompt's first token is at position 0 however much
padding precedes it. Learned (and sinusoidal) positions need this: shifted, they would be other
vectors. Relative schemes would not — RoPE's score depends on ``n − m`` only (Su et al., 2021),
ALiBi's (Press et al., 2022) and T5's on ``i − j``, which a row's contiguous tokens keep — but
with the row's own positions RoPE also rotates by the very angles of the unbatched run (and
length-dependent RoPE scaling sees the row's length). Each row gets the tokens it would get
alone (up to float rounding)::

    ids, mask = pad_prompts([[5, 6, 7], [8]], pad_id=0)        # ids [[5, 6, 7], [0, 0, 8]]
    out = generate(model, ids, 10, attention_mask=mask, temperature=0)  # (2, 3 + 10)
    new_tokens = out[:, ids.shape[1]:]                          # aligned across the rows
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from companion._validation import check_int
from companion.models.gpt import GPT, check_ids
from companion.models.transformer import Transformer

__all__ = ["sampling_probs", "generate", "pad_prompts", "greedy_decode", "beam_search", "length_penalty"]


def _check_sampling(temperature: object, top_k: object, top_p: object) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        check_int("top_k", top_k, 1)
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")


def sampling_probs(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> Tensor:
    """The distribution generation samples the next token from: ``(..., vocab)`` logits -> probabilities.

    Applied in this order: temperature, top-k, top-p (as Hugging Face's ``generate`` does).
    ``temperature=0`` gives a one-hot vector on the argmax (greedy). ``top_p=1`` and
    ``top_k=None`` leave the softmax untouched. ``top_k`` keeps every token whose logit ties the
    ``k``-th largest, as Hugging Face's ``TopKLogitsWarper`` does, so ``top_k=1`` is greedy only
    where the largest logit is unique; with a tie it samples among the tied tokens (trained models'
    float logits almost never tie; ``temperature=0`` breaks a tie by the lowest id). The result is
    float32 (at least) and sums to 1 along the last dim.
    """
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        got = f"dtype {logits.dtype}" if isinstance(logits, Tensor) else type(logits).__name__
        raise TypeError(f"logits must be a floating-point tensor (..., vocab), got {got}")
    _check_sampling(temperature, top_k, top_p)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    scores = logits / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = scores.softmax(-1)
    if top_p is not None and top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the more probable tokens
        drop = (before >= top_p).scatter(-1, order, before >= top_p)  # back to vocabulary order
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class _EvalMode:
    """Put a model in eval mode and inference mode (``inference=False``: no_grad) for the duration.

    ``torch.inference_mode`` is ``no_grad`` without autograd's version counters and view
    tracking: about 10% off a small model's decoding step, where per-operation overhead is most
    of the time. Tensors made inside are "inference tensors", which autograd refuses to save, so
    the decoders return a clone of their output (an ordinary tensor).
    """

    def __init__(self, model: nn.Module, inference: bool = True) -> None:
        self.model, self.was_training = model, model.training
        self.inference = torch.inference_mode() if inference else torch.no_grad()

    def __enter__(self) -> None:
        self.model.eval()
        self.inference.__enter__()

    def __exit__(self, *exc) -> None:
        self.inference.__exit__(*exc)
        self.model.train(self.was_training)


def pad_prompts(prompts: list[list[int]] | list[Tensor], pad_id: int, *,
                device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Left-pad prompts of different lengths into one batch for :func:`generate`.

    Args:
        prompts: token ids, each a list of ints or a 1-D integer tensor, at least one token each.
        pad_id: the id written at the padding (any id of the vocabulary: the mask hides it).
        device: of the results; default the first tensor prompt's, else the CPU.

    Returns:
        ``(ids, attention_mask)``, both ``(batch, longest)`` long tensors: row ``r`` is
        ``[pad_id] * (longest - len(prompts[r])) + prompts[r]`` and its mask is 0 at the padding,
        1 at the tokens (Hugging Face's convention).
    """
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of token-id lists or 1-D tensors, got {prompts!r}")
    check_int("pad_id", pad_id, 0)
    rows = []
    for i, p in enumerate(prompts):
        if isinstance(p, Tensor) and p.dim() == 1 and not p.is_floating_point() and p.dtype != torch.bool:
            rows.append(p)
        elif isinstance(p, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            rows.append(torch.tensor(p, dtype=torch.long))
        else:
            got = f"shape {tuple(p.shape)}, dtype {p.dtype}" if isinstance(p, Tensor) else repr(p)
            raise ValueError(f"prompts[{i}] must be a list of ints or a 1-D integer tensor, got {got}")
        if len(rows[-1]) == 0:
            raise ValueError(f"prompts[{i}] is empty: every prompt needs at least one token")
    if device is None:
        device = next((p.device for p in prompts if isinstance(p, Tensor)), torch.device("cpu"))
    longest = max(len(row) for row in rows)
    ids = torch.full((len(rows), longest), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), longest), dtype=torch.long, device=device)
    for r, row in enumerate(rows):
        ids[r, longest - len(row):] = row.to(device)
        mask[r, longest - len(row):] = 1
    return ids, mask


def _left_padding(attention_mask: object, ids: Tensor) -> Tensor | None:
    """``attention_mask`` checked to be left padding, as bool ``(batch, prompt_len)``; None if it hides nothing."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(ids.shape):
        got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask must be a tensor of shape (batch, prompt_len) = {tuple(ids.shape)}, "
                         f"got {got}")
    keep = attention_mask.to(ids.device)
    if keep.dtype != torch.bool:
        if ((keep != 0) & (keep != 1)).any():
            raise ValueError(f"attention_mask must hold 1 (token) and 0 (padding) only, got the values "
                             f"{keep.unique().tolist()}")
        keep = keep == 1
    empty = (~keep.any(1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"attention_mask rows {empty} are all padding: every prompt needs at least one token")
    right = (keep[:, :-1] & ~keep[:, 1:]).any(1).nonzero().flatten().tolist()
    if right:
        raise ValueError(f"attention_mask must be left padding (0s, then 1s): rows {right} have a 0 after a 1 "
                         "(right padding; pad_prompts left-pads)")
    return None if bool(keep.all()) else keep


def generate(model: GPT, ids: Tensor, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, eos_id: int | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True, attention_mask: Tensor | None = None, pad_id: int | None = None) -> Tensor:
    """Continue each prompt of ``ids`` ``(batch, prompt_len)`` by up to ``max_new_tokens`` tokens.

    Each step samples from :func:`sampling_probs` of the last position's logits
    (``temperature=0``: greedy). With ``use_cache`` the prompt is run once into a
    :class:`~companion.attention.KVCache` and each step runs the model on the new token alone
    (a model with ``config.sliding_window``, no padding and no ALiBi or T5 bias gets a
    :class:`~companion.attention.RollingKVCache`: memory O(window), whatever the length);
    without, each step re-runs the whole sequence. Both give the same tokens (with the same
    seeded ``generator`` when sampling).

    Prompts of different lengths come left-padded, with an ``attention_mask`` (see
    :func:`pad_prompts` and the module docstring): each row then gets the tokens it would get
    alone, greedy or sampled from the same distribution.

    Past ``config.max_len``: a learned position table has no row there, so a request that would
    need one is a ``ValueError``. The other schemes (RoPE, sinusoidal, ALiBi, T5, none) give every
    position a value, and the model's forward pass accepts longer inputs, so generation goes on
    past ``max_len`` as that forward pass would: the model then reads positions it never trained
    on (extrapolation, which Chapters 6b and 14c measure).

    Args:
        model: a :class:`~companion.models.gpt.GPT` (put in eval mode for the call).
        ids: prompts, left-padded to a common length if they differ.
        max_new_tokens: tokens to add.
        temperature, top_k, top_p: see :func:`sampling_probs`.
        eos_id: a sequence that emits it is finished; its later positions hold ``pad_id``, and
            generation stops early when every sequence is finished.
        generator: a seeded ``torch.Generator`` (on the model's device) for reproducible samples.
        use_cache: decode with a KV cache.
        attention_mask: ``(batch, prompt_len)``, 1 at tokens and 0 at left padding; None (or all
            ones): no padding. Right padding (a 0 after a 1) is a ``ValueError``.
        pad_id: what fills a finished sequence's later positions; default ``eos_id`` (repeated).

    Returns:
        ``(batch, prompt_len + n)`` ids, the prompts (padding included) then the new tokens,
        ``n <= max_new_tokens`` (``n < max_new_tokens`` only when every row emitted ``eos_id``).
    """
    if not isinstance(model, GPT):
        raise TypeError(f"model must be a companion GPT, got {type(model).__name__}")
    vocab = model.config.vocab_size
    check_ids("ids", ids, vocab)
    check_int("max_new_tokens", max_new_tokens, 1)
    _check_sampling(temperature, top_k, top_p)
    if eos_id is not None:
        check_int("eos_id", eos_id, 0)
    if pad_id is not None and (isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < vocab):
        raise ValueError(f"pad_id must be None or an id in [0, {vocab}), got {pad_id!r}")
    keep = _left_padding(attention_mask, ids)
    batch, prompt_len = ids.shape
    total = prompt_len + max_new_tokens
    longest = prompt_len if keep is None else int(keep.sum(1).max())  # most tokens of one row, padding aside
    if model.config.position == "learned" and longest + max_new_tokens > model.config.max_len:
        raise ValueError(f"prompt_len + max_new_tokens = {longest + max_new_tokens} exceeds the model's "
                         f"max_len={model.config.max_len} learned positions")
    keys = positions = None  # no padding: the model's own positions, past + arange(seq)
    if keep is not None:
        keys = torch.cat([keep, keep.new_ones(batch, max_new_tokens)], dim=1)  # (batch, total): real keys
        start = (keep.long().cumsum(1) - 1).clamp(min=0)  # (batch, prompt_len): each row counts from 0
        steps = torch.arange(1, max_new_tokens + 1, device=ids.device)
        positions = torch.cat([start, start[:, -1:] + steps], dim=1)  # (batch, total)
    fill = eos_id if pad_id is None else pad_id
    with _EvalMode(model):
        # a sliding-window model keeps only its last window of keys (Mistral's rolling buffer), unless
        # padding or a score bias (ALiBi, T5) needs the keys' true positions
        biased = model.config.position in ("alibi", "t5")
        rolling = model.config.sliding_window is not None and keep is None and not biased
        cache = model.make_cache(batch, total, rolling=rolling) if use_cache else None
        logits = model(ids, cache=cache, attention_mask=keep,
                       positions=None if positions is None else positions[:, :prompt_len])[:, -1]
        out, finished = ids, torch.zeros(batch, dtype=torch.bool, device=ids.device)
        for step in range(max_new_tokens):
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                probs = sampling_probs(logits, temperature, top_k, top_p)
                nxt = torch.multinomial(probs, 1, generator=generator)
            if eos_id is not None:
                nxt = nxt.masked_fill(finished[:, None], fill)
                finished |= nxt[:, 0] == eos_id
            out = torch.cat([out, nxt], dim=1)
            if step == max_new_tokens - 1 or (eos_id is not None and bool(finished.all())):
                break
            # checked once above; each step skips the model's own input checks
            n = out.shape[1]
            mask = None if keys is None else keys[:, None, None, :n]  # (batch, 1, 1, keys): over heads, queries
            if use_cache:
                hidden = model._hidden(nxt, mask, cache, None if positions is None else positions[:, n - 1:n], False)
            else:
                hidden = model._hidden(out, mask, None, None if positions is None else positions[:, :n], False)[:, -1:]
            logits = model.head(hidden)[:, -1]
    return out.clone()  # an ordinary tensor, not an inference tensor (see _EvalMode)


def _check_seq2seq(model: object, src: object, bos_id: object, eos_id: object, max_len: object) -> None:
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a companion Transformer, got {type(model).__name__}")
    check_ids("src", src, model.src_vocab_size)
    check_int("max_len", max_len)
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if name == "eos_id" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < model.tgt_vocab_size:
            raise ValueError(f"{name} must be a target id in [0, {model.tgt_vocab_size}), got {value!r}")


def greedy_decode(model: Transformer, src: Tensor, bos_id: int, eos_id: int | None, max_len: int = 32, *,
                  use_cache: bool = True) -> Tensor:
    """Translate by always taking the most probable next token.

    Args:
        model: a :class:`~companion.models.transformer.Transformer` (eval mode for the call).
        src: source ids ``(batch, src_len)``.
        bos_id, eos_id: the target's start and end tokens; ``eos_id=None`` always generates
            ``max_len`` tokens (for timing, say).
        max_len: most tokens generated after ``<bos>``.
        use_cache: decode one new token per step with self- and cross-attention caches.

    Returns:
        ``(batch, ≤ max_len + 1)`` ids starting with ``<bos>``; after a sequence's ``<eos>`` the
        rest of its row is ``pad_id``. Stops early when every row has ended.
    """
    _check_seq2seq(model, src, bos_id, eos_id, max_len)
    with _EvalMode(model):
        memory, mask = model.encode(src)
        cache, cross = model.make_caches(src.shape[0], max_len + 1, src.shape[1]) if use_cache else (None, None)
        out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            step_in = out[:, -1:] if use_cache else out
            nxt = model.decode(step_in, memory, mask, cache=cache, cross_cache=cross)[:, -1].argmax(-1)
            nxt = nxt.masked_fill(done, model.pad_id)
            out = torch.cat([out, nxt[:, None]], dim=1)
            if eos_id is not None:
                done |= nxt == eos_id
            if bool(done.all()):
                break
    return out.clone()  # an ordinary tensor, not an inference tensor (see _EvalMode)


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's length normaliser ``((5 + length) / 6) ** alpha`` (Wu et al., 2016, eq. 14); 1 when ``alpha = 0``."""
    return ((5 + length) / 6) ** alpha


def beam_search(model: Transformer, src: Tensor, bos_id: int, eos_id: int | None, beam_size: int = 4,
                max_len: int = 32,
                alpha: float = 0.6, return_scores: bool = False, *,
                use_cache: bool = True, early_stopping: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Keep the ``beam_size`` best partial translations at every step; return the best finished one.

    Beam search is the decoder of Sutskever et al. (2014) and of the Transformer paper (beam 4).
    A hypothesis' score is its total log-probability divided by :func:`length_penalty` (Wu et
    al., 2016; ``alpha = 0``: plain log-probability, which favours short outputs; the
    Transformer uses ``alpha = 0.6``). A hypothesis that emits ``eos_id`` is finished (any
    ``eos_id`` candidate ranked ahead of the ``beam_size``-th live one; Hugging Face counts only
    those in the top ``beam_size``). By default the search goes on while a live hypothesis could
    still win: log-probabilities only fall and the normaliser only grows, so a live beam can at
    best reach ``logp / length_penalty(max_len, alpha)``, and the search stops when that bound is
    below the best finished score. That is the Transformer's decoder ("terminate early when
    possible": tensor2tensor's ``_is_finished`` uses the same bound). ``early_stopping=True`` stops
    as soon as ``beam_size`` hypotheses are finished, as Hugging Face's ``early_stopping=True``
    does: cheaper, but a longer hypothesis that would have scored higher is never seen. If the
    search reaches ``max_len``, the unfinished hypotheses are scored as they are. ``beam_size=1``
    is greedy decoding.

    With ``use_cache`` each step runs the decoder on the beams' last tokens only; the
    self-attention cache is reordered to follow each surviving beam's parent.

    Args:
        model, src, bos_id, eos_id, max_len, use_cache: as :func:`greedy_decode`; ``src`` rows
            are searched one after another.
        beam_size: hypotheses kept per step.
        alpha: length-penalty exponent.
        return_scores: also return the best normalised score of each row ``(batch,)``.
        early_stopping: stop at ``beam_size`` finished hypotheses (True), or when no live one can
            beat the best finished (False, the default).

    Returns:
        ``(batch, L)`` ids starting with ``<bos>``, right-padded with ``pad_id`` (and the scores).
    """
    _check_seq2seq(model, src, bos_id, eos_id, max_len)
    check_int("beam_size", beam_size)
    best_rows, best_scores = [], []
    with _EvalMode(model):
        for row in range(src.shape[0]):
            memory, mask = model.encode(src[row : row + 1])
            cache, cross = model.make_caches(1, max_len + 1, src.shape[1]) if use_cache else (None, None)
            beams = torch.full((1, 1), bos_id, dtype=torch.long, device=src.device)
            logp = torch.zeros(1, device=src.device)  # total log-probability of each live beam
            finished: list[tuple[float, Tensor]] = []
            for step in range(1, max_len + 1):
                k = beams.shape[0]
                step_in = beams[:, -1:] if use_cache else beams
                logits = model.decode(step_in, memory.expand(k, -1, -1), mask.expand(k, -1, -1, -1), cache=cache,
                                      cross_cache=cross)[:, -1]
                cand = (logp[:, None] + logits.log_softmax(-1)).flatten()  # (k · vocab,)
                top, idx = cand.topk(min(2 * beam_size, cand.numel()))
                vocab = logits.shape[-1]
                keep_beams, keep_logp, parents = [], [], []
                for score, i in zip(top.tolist(), idx.tolist()):
                    seq = torch.cat([beams[i // vocab], beams.new_tensor([i % vocab])])
                    if i % vocab == eos_id:
                        finished.append((score / length_penalty(step, alpha), seq))
                    else:
                        keep_beams.append(seq)
                        keep_logp.append(score)
                        parents.append(i // vocab)
                    if len(keep_beams) == beam_size:
                        break
                if not keep_beams:
                    break
                if early_stopping and len(finished) >= beam_size:
                    break
                if not early_stopping and finished and (
                        max(keep_logp) / length_penalty(max_len, alpha) <= max(f[0] for f in finished)):
                    break  # no live beam can beat the best finished one
                beams, logp = torch.stack(keep_beams), torch.tensor(keep_logp, device=src.device)
                if use_cache:  # each surviving beam continues its parent's cached keys and values
                    index = torch.tensor(parents, device=src.device)
                    cache.reorder(index)
                    cross.reorder(index)
            else:  # ran out of length (no stop above): score the live beams as they are
                finished += [(s / length_penalty(beams.shape[1] - 1, alpha), b) for s, b in zip(logp.tolist(), beams)]
            score, seq = max(finished, key=lambda f: f[0])
            best_rows.append(seq)
            best_scores.append(score)
    longest = max(len(s) for s in best_rows)
    out = torch.full((len(best_rows), longest), model.pad_id, dtype=torch.long, device=src.device)
    for r, s in enumerate(best_rows):
        out[r, : len(s)] = s
    scores = torch.tensor(best_scores)
    return (out, scores) if return_scores else out
