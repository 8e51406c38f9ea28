"""Speculative decoding: a small draft model guesses, the large target model checks (Chapter 15).

Decoding one token costs one forward pass of the model, and for a large model at batch size 1
that pass is bound by reading the weights, not by arithmetic: scoring ``k + 1`` positions costs
about as much as scoring one. Speculative decoding (Leviathan et al., 2023; Chen et al., 2023)
spends that idle arithmetic. Each *round*

1. the cheap draft model proposes ``k`` tokens ``x_1 … x_k`` one at a time, sampling each from
   its own distribution ``q_i = q(· | prefix, x_<i)``;
2. the target scores the prefix and all ``k`` proposals in **one** forward pass, which gives its
   distributions ``p_1 … p_{k+1}`` at the ``k + 1`` positions;
3. proposal ``x_i`` is accepted with probability ``min(1, p_i(x_i) / q_i(x_i))``; at the first
   rejection the round ends with a token drawn from the *residual* distribution
   ``norm(max(0, p_i − q_i))``; if all ``k`` are accepted, a bonus token is drawn from ``p_{k+1}``.

Every round emits between 1 and ``k + 1`` tokens for one target pass, and the tokens are
distributed **exactly** as if sampled from the target alone: the accepted mass ``min(p, q)`` plus
the rejected mass ``(1 − Σ min(p, q)) · norm(max(0, p − q))`` is ``p``, token by token (Leviathan
et al., 2023, Theorem 3.5). With acceptance rate ``α = Σ min(p, q)`` a round emits
``(1 − α^{k+1}) / (1 − α)`` tokens on average. At ``temperature = 0`` both distributions are
one-hot: a proposal is accepted iff it is the target's argmax, and the output is the target's
greedy decoding, token for token.

Both models keep a :class:`~companion.attention.KVCache`. After a rejection the caches hold keys
and values of rejected proposals; :meth:`~companion.attention.KVCache.crop` rewinds them to the
accepted length, and the next round feeds each model the tokens its cache is missing. With
``use_cache=False`` every pass re-runs the whole sequence instead (the same tokens, more work).

Example::

    target, draft = GPT(ModelConfig.preset("small")), GPT(ModelConfig.preset("tiny"))
    out, stats = speculative_generate(target, draft, ids, 64, k=4, temperature=0)
    # out == generate(target, ids, 64, temperature=0); stats.acceptance_rate, stats.target_passes
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from companion._validation import check_int
from companion.attention import KVCache
from companion.generation import _check_sampling, _EvalMode, sampling_probs
from companion.models.gpt import GPT, check_ids

__all__ = ["SpeculativeStats", "verify_draft", "speculative_generate"]


@dataclass
class SpeculativeStats:
    """What a :func:`speculative_generate` call did.

    Attributes:
        proposed: draft tokens proposed (over all rounds).
        accepted: of those, accepted by the target.
        rejected: of those, rejected by the target: one per round that ended before its proposals
            ran out. The proposals after a rejection are never tested, so ``proposed`` can exceed
            ``accepted + rejected``.
        target_passes: target forward passes, one per round (prompt included in the first).
        draft_passes: draft forward passes, one per proposed token.
        generated: tokens emitted; always ``accepted + target_passes`` (each round adds one token
            of its own: the residual sample or the bonus).
    """

    proposed: int = 0
    accepted: int = 0
    rejected: int = 0
    target_passes: int = 0
    draft_passes: int = 0
    generated: int = 0

    @property
    def acceptance_rate(self) -> float:
        """``accepted / proposed`` (NaN when nothing was proposed)."""
        return self.accepted / self.proposed if self.proposed else math.nan

    @property
    def alpha(self) -> float:
        """``accepted / (accepted + rejected)``: the chance that a *tested* proposal is accepted.

        This estimates Leviathan et al.'s per-token acceptance rate ``α = E[Σ min(p, q)]``, from
        which ``(1 − α^{k+1}) / (1 − α)`` predicts the tokens per target pass. It is at least
        :attr:`acceptance_rate`, which also counts the untested proposals after each rejection as
        lost (NaN when nothing was tested).
        """
        tested = self.accepted + self.rejected
        return self.accepted / tested if tested else math.nan

    @property
    def tokens_per_target_pass(self) -> float:
        """``generated / target_passes``: the speed-up in target passes over plain decoding (1 token per pass)."""
        return self.generated / self.target_passes if self.target_passes else math.nan


def verify_draft(p: Tensor, q: Tensor, draft: Tensor, *, generator: torch.Generator | None = None
                 ) -> tuple[Tensor, Tensor]:
    """Accept a prefix of the draft and sample the token after it: the rejection step of speculative sampling.

    Batched over independent rows (for a many-draw test of the exactness theorem; generation
    uses one row).

    Args:
        p: target probabilities ``(batch, k + 1, vocab)`` at the ``k`` proposals and after them.
        q: draft probabilities ``(batch, k, vocab)`` the proposals were sampled from.
        draft: proposed ids ``(batch, k)``.
        generator: a seeded ``torch.Generator`` on ``p``'s device.

    Returns:
        ``(n_accepted, next_token)``, both ``(batch,)``: proposal ``x_i`` is accepted with
        probability ``min(1, p_i(x_i) / q_i(x_i))``, ``n_accepted`` counts those before the first
        rejection, and ``next_token`` is drawn from ``norm(max(0, p_n − q_n))`` at
        ``n = n_accepted`` (the bonus token from ``p_{k+1}`` when all ``k`` are accepted).
    """
    if p.dim() != 3 or q.dim() != 3 or draft.dim() != 2 or q.shape[:2] != draft.shape \
            or p.shape != (q.shape[0], q.shape[1] + 1, q.shape[2]):
        raise ValueError(f"p, q and draft must have shapes (batch, k + 1, vocab), (batch, k, vocab) and (batch, k), "
                         f"got {tuple(p.shape)}, {tuple(q.shape)} and {tuple(draft.shape)}")
    batch, k = draft.shape
    index = draft.to(torch.long)[..., None]
    p_x, q_x = p[:, :k].gather(-1, index)[..., 0], q.gather(-1, index)[..., 0]  # (batch, k)
    u = torch.rand(batch, k, generator=generator, device=p.device, dtype=p.dtype)
    accept = u * q_x < p_x  # u < p/q without dividing; always true when p >= q (u < 1)
    n = accept.long().cumprod(-1).sum(-1)  # (batch,): proposals accepted before the first rejection
    rows = torch.arange(batch, device=p.device)
    q_pad = torch.cat([q, q.new_zeros(batch, 1, q.shape[2])], 1)  # q = 0 after the proposals: residual = p (bonus)
    residual = (p[rows, n] - q_pad[rows, n]).clamp_min(0)  # (batch, vocab)
    # a rejection means p(x) < q(x), so the residual has mass; guard against rounding all the same
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[rows, n])
    return n, torch.multinomial(residual, 1, generator=generator)[:, 0]


def _logits(model: GPT, ids: Tensor, cache: KVCache | None) -> Tensor:
    # inputs are checked once at the entry point; each pass skips the model's own checks (as generate does)
    return model.head(model._hidden(ids, None, cache, None, False))


def speculative_generate(target: GPT, draft: GPT, ids: Tensor, max_new_tokens: int, *, k: int = 4,
                         temperature: float = 1.0, generator: torch.Generator | None = None,
                         use_cache: bool = True) -> tuple[Tensor, SpeculativeStats]:
    """Continue the prompt ``ids`` ``(1, prompt_len)`` by ``max_new_tokens`` tokens of ``target``, drafted by ``draft``.

    The tokens are distributed as :func:`~companion.generation.generate`'s from ``target`` alone
    at the same ``temperature`` (see the module docstring); ``temperature=0`` gives exactly
    ``generate(target, ids, max_new_tokens, temperature=0)``.

    Args:
        target: the model whose distribution is sampled (a :class:`~companion.models.gpt.GPT`).
        draft: a cheaper GPT with the same ``vocab_size`` (and tokenizer).
        ids: one prompt, ``(1, prompt_len)`` (batch size 1 only).
        max_new_tokens: tokens to add.
        k: tokens the draft proposes per round (fewer in the last rounds, so as not to overshoot).
        temperature: divides both models' logits (:func:`~companion.generation.sampling_probs`).
        generator: a seeded ``torch.Generator`` (on the models' device) for reproducible samples.
        use_cache: keep a KV cache per model, rewound after rejections; else re-run the prefix.

    Returns:
        ``(tokens, stats)``: ``(1, prompt_len + max_new_tokens)`` ids, prompt included, and a
        :class:`SpeculativeStats`.
    """
    for name, model in (("target", target), ("draft", draft)):
        if not isinstance(model, GPT):
            raise TypeError(f"{name} must be a companion GPT, got {type(model).__name__}")
    vocab_size = target.config.vocab_size
    if draft.config.vocab_size != vocab_size:
        raise ValueError(f"draft.config.vocab_size must equal target.config.vocab_size={vocab_size}, "
                         f"got {draft.config.vocab_size}")
    check_ids("ids", ids, vocab_size)
    if ids.shape[0] != 1 or ids.shape[1] == 0:
        raise ValueError(f"ids must have shape (1, prompt_len >= 1) (speculative decoding runs one sequence), "
                         f"got {tuple(ids.shape)}")
    check_int("max_new_tokens", max_new_tokens, 1)
    check_int("k", k, 1)
    _check_sampling(temperature, None, None)
    total = ids.shape[1] + max_new_tokens
    for name, model in (("target", target), ("draft", draft)):
        if model.config.position == "learned" and total > model.config.max_len:
            raise ValueError(f"prompt_len + max_new_tokens = {total} exceeds {name}'s max_len="
                             f"{model.config.max_len} learned positions")
    greedy, stats = temperature == 0, SpeculativeStats()
    with _EvalMode(target), _EvalMode(draft):
        t_cache = target.make_cache(1, total) if use_cache else None
        d_cache = draft.make_cache(1, total) if use_cache else None
        out = ids
        while out.shape[1] < total:
            start = out.shape[1]
            k_round = min(k, total - start - 1)  # the round's bonus token may be the last one wanted
            seq, qs = out, []
            for _ in range(k_round):  # 1. the draft proposes, one token per pass
                fed = seq[:, d_cache.seq_len():] if use_cache else seq  # what the cache lacks
                logits = _logits(draft, fed, d_cache)[:, -1]  # (1, vocab)
                if greedy:
                    x = logits.argmax(-1, keepdim=True)
                else:
                    qs.append(sampling_probs(logits, temperature))
                    x = torch.multinomial(qs[-1], 1, generator=generator)
                seq = torch.cat([seq, x.to(seq.dtype)], 1)
            # 2. the target scores the k_round + 1 positions in one pass
            fed = seq[:, t_cache.seq_len():] if use_cache else seq
            logits = _logits(target, fed, t_cache)[:, -(k_round + 1):]  # (1, k_round + 1, vocab)
            proposals = seq[:, start:]  # (1, k_round)
            if greedy:  # 3. accept while the proposal is the target's argmax; then the target's own token
                best = logits.argmax(-1)  # (1, k_round + 1)
                n = int((proposals == best[:, :k_round]).long().cumprod(-1).sum())
                nxt = best[:, n]
            else:
                p = sampling_probs(logits, temperature)
                q = torch.stack(qs, 1) if qs else p.new_zeros(1, 0, vocab_size)
                n_acc, nxt = verify_draft(p, q, proposals, generator=generator)
                n = int(n_acc)
            out = torch.cat([seq[:, : start + n], nxt.view(1, 1).to(seq.dtype)], 1)
            if use_cache:  # rewind past the rejected proposals; the new token is fed next round
                t_cache.crop(start + n)
                d_cache.crop(start + n)
            stats.proposed += k_round
            stats.accepted += n
            stats.rejected += int(n < k_round)
            stats.target_passes += 1
            stats.draft_passes += k_round
    stats.generated = out.shape[1] - ids.shape[1]
    return out.clone(), stats  # an ordinary tensor, not an inference tensor (see generate)
