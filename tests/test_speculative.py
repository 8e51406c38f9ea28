"""Tests for companion.inference.speculative: greedy identity, exactness of the sampling, HF parity, bad arguments."""

import logging
import warnings

import pytest
import torch

from companion.config import ModelConfig
from companion.generation import generate, sampling_probs
from companion.inference.speculative import SpeculativeStats, speculative_generate, verify_draft
from companion.models.gpt import GPT

# Upper 1e-3 quantiles of the chi-square distribution by degrees of freedom, i.e.
# scipy.stats.chi2.ppf(1 - 1e-3, df) (scipy is not a dependency; checked against it when installed).
# Every goodness-of-fit test below rejects at significance 1e-3.
CHI2_CRITICAL_1E3 = {3: 16.266, 4: 18.467, 24: 51.179}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def fits(counts: torch.Tensor, probs: torch.Tensor) -> bool:
    """Pearson's chi-square goodness-of-fit of ``counts`` to ``probs`` at significance 1e-3.

    An outcome of probability 0 that occurs rejects outright; the other cells must each expect
    at least 5 draws (Pearson's approximation), with ``cells - 1`` degrees of freedom.
    """
    counts, probs = counts.double().flatten(), probs.double().flatten()
    possible = probs > 0
    if counts[~possible].sum() > 0:
        return False
    expected = counts.sum() * probs[possible] / probs[possible].sum()
    assert expected.min() >= 5, "too few draws for the chi-square approximation"
    stat = ((counts[possible] - expected) ** 2 / expected).sum()
    return bool(stat < CHI2_CRITICAL_1E3[int(possible.sum()) - 1])


def test_chi_square_critical_values_match_scipy():
    chi2 = pytest.importorskip("scipy.stats").chi2
    for df, value in CHI2_CRITICAL_1E3.items():
        assert value == pytest.approx(chi2.ppf(1 - 1e-3, df), abs=1e-3)


# ------------------------------------------------------------------ the rejection step: exactness theorem

# Context-free distributions over 5 tokens for k = 3 proposals: p_j for the target at positions
# 0..3 (3: the bonus), q_j for the draft. The draft proposes tokens the target never emits (p = 0),
# and under-proposes others, so acceptance, rejection, residual and bonus all occur.
P = torch.tensor([[0.40, 0.30, 0.20, 0.10, 0.00],
                  [0.00, 0.10, 0.20, 0.30, 0.40],
                  [0.25, 0.00, 0.25, 0.25, 0.25],
                  [0.10, 0.20, 0.00, 0.30, 0.40]])
Q = torch.tensor([[0.10, 0.30, 0.20, 0.20, 0.20],
                  [0.20, 0.20, 0.20, 0.20, 0.20],
                  [0.40, 0.30, 0.10, 0.10, 0.10]])


def _emitted(verify, draws=100_000, seed=0):
    """Run one round ``draws`` times; return the tokens emitted at each position (-1: not reached) and n."""
    g = torch.Generator().manual_seed(seed)
    k = Q.shape[0]
    draft = torch.stack([torch.multinomial(Q[j], draws, replacement=True, generator=g) for j in range(k)], 1)
    n, nxt = verify(P.expand(draws, -1, -1), Q.expand(draws, -1, -1), draft, generator=g)
    tokens = torch.full((draws, k + 1), -1)
    positions = torch.arange(k + 1)
    tokens[:, :k] = torch.where(positions[:k] < n[:, None], draft, -1)  # the accepted proposals
    tokens[torch.arange(draws), n] = nxt  # then the residual (or bonus) token
    return tokens, n


def _counts(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens[tokens >= 0], minlength=5)


def test_verify_draft_emits_the_target_distribution_at_every_position():
    tokens, n = _emitted(verify_draft)
    for j in range(4):  # position j is reached when the j proposals before it were accepted
        assert fits(_counts(tokens[:, j]), P[j]), f"position {j}"
        if j < 3:  # power: the same test rejects the draft's own distribution
            assert not fits(_counts(tokens[:, j]), Q[j])
    # accepted proposals before the first rejection: P(x_j accepted) = Σ min(p_j, q_j) (Leviathan et al., 2023)
    alpha = torch.minimum(P[:3], Q).sum(-1)  # 0.7, 0.7, 0.55
    reach = torch.cat([torch.ones(1), alpha.cumprod(0)])  # P(n >= j)
    p_n = reach - torch.cat([reach[1:], torch.zeros(1)])
    assert fits(torch.bincount(n, minlength=4), p_n)


def test_resampling_from_p_instead_of_the_residual_is_detected():
    def broken(p, q, draft, generator=None):  # the classic mistake: after a rejection, sample from p
        n, _ = verify_draft(p, q, draft, generator=generator)
        rows = torch.arange(p.shape[0])
        return n, torch.multinomial(p[rows, n], 1, generator=generator)[:, 0]

    tokens, _ = _emitted(broken)
    assert not fits(_counts(tokens[:, 0]), P[0])  # min(p, q) + (1 - α) p is not p


def test_verify_draft_with_no_proposals_samples_p_and_checks_shapes():
    g = torch.Generator().manual_seed(0)
    n, nxt = verify_draft(P[None, :1].expand(20_000, -1, -1), torch.zeros(20_000, 0, 5),
                          torch.zeros(20_000, 0, dtype=torch.long), generator=g)
    assert n.eq(0).all() and fits(torch.bincount(nxt, minlength=5), P[0])
    with pytest.raises(ValueError, match=r"p, q and draft must have shapes"):
        verify_draft(P[None], Q[None], torch.zeros(1, 2, dtype=torch.long))


# ------------------------------------------------------------------ greedy: identical to the target's generate


def _gpt(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)  # untied: random tied-embedding models all just repeat the last token
    return GPT(ModelConfig.preset("tiny", **{"vocab_size": 50, "max_len": 32, "tie_embeddings": False, **kw}))


def _draft(target: GPT, kind: str) -> GPT:
    if kind == "same":
        return target
    if kind == "other_seed":  # an unrelated model: nearly always disagrees
        return _gpt(1, **{"position": target.config.position, "n_layers": 1})
    draft = GPT(target.config.replace(n_layers=1))  # "shallow": the target's first block, sometimes agrees
    draft.load_state_dict(target.state_dict(), strict=False)
    return draft.to(target.head.weight.device)


PROMPT = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", ["other_seed", "shallow", "same"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_gives_the_targets_greedy_tokens(k, kind):
    target = _gpt(0, n_layers=3)
    draft = _draft(target, kind)
    expected = generate(target, PROMPT, 27, temperature=0)  # 5 + 27 = max_len: proposals must not overshoot
    for use_cache in (True, False):
        out, stats = speculative_generate(target, draft, PROMPT, 27, k=k, temperature=0, use_cache=use_cache)
        assert torch.equal(out, expected)
        assert stats.generated == 27 == stats.accepted + stats.target_passes  # each round adds one own token
        assert stats.draft_passes == stats.proposed and stats.accepted <= stats.proposed
    if kind == "same":
        assert stats.acceptance_rate == 1.0 and stats.target_passes == -(-27 // (k + 1))
    elif kind == "shallow":  # both paths exercised: some proposals accepted, some rejected
        assert 0 < stats.acceptance_rate < 1
    else:
        assert stats.acceptance_rate < 0.5


def test_rejections_are_counted_once_per_round_that_ends_early():
    target = _gpt(0, n_layers=3)
    for kind in ("same", "shallow", "other_seed"):
        draft = _draft(target, kind)
        for k in (1, 3):
            _, stats = speculative_generate(target, draft, PROMPT, 27, k=k, temperature=0)
            assert stats.accepted + stats.rejected <= stats.proposed and stats.rejected <= stats.target_passes
            if k == 1:  # every proposal is tested: accepted or rejected
                assert stats.accepted + stats.rejected == stats.proposed
            if kind == "same":
                assert stats.rejected == 0 and stats.alpha == 1.0
            else:
                assert stats.rejected > 0 and stats.alpha < 1
                if k == 3 and stats.accepted:  # untested proposals after a rejection count against acceptance_rate only
                    assert stats.acceptance_rate < stats.alpha
    empty = SpeculativeStats()
    assert empty.alpha != empty.alpha  # NaN when nothing was tested


@pytest.mark.parametrize("preset, overrides", [("tiny", {"position": "rope"}), ("tiny", {"position": "alibi"}),
                                               ("tiny", {"position": "t5"}), ("llama-tiny", {}),
                                               ("llama-tiny", {"sliding_window": 4})])
def test_greedy_identity_across_positions_and_caches(preset, overrides):
    torch.manual_seed(0)
    target = GPT(ModelConfig.preset(preset, vocab_size=50, max_len=32, n_layers=3, tie_embeddings=False,
                                    **overrides))
    draft = _draft(target, "shallow")
    out, stats = speculative_generate(target, draft, PROMPT, 20, k=3, temperature=0)
    assert torch.equal(out, generate(target, PROMPT, 20, temperature=0))
    assert 0 < stats.accepted < stats.proposed


def test_sampling_is_reproducible_and_the_cache_changes_nothing():
    target = _gpt(0, n_layers=3)
    draft = _draft(target, "shallow")
    runs = [speculative_generate(target, draft, PROMPT, 20, k=3, temperature=0.7,
                                 generator=torch.Generator().manual_seed(5), use_cache=use)
            for use in (True, True, False)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][0], runs[2][0])
    assert runs[0][1] == runs[2][1] and runs[0][1].generated == 20 == runs[0][1].accepted + runs[0][1].target_passes
    # the target as its own draft: p = q, so every proposal is accepted
    _, stats = speculative_generate(target, target, PROMPT, 20, k=3, generator=torch.Generator().manual_seed(5))
    assert stats.acceptance_rate == 1.0 and stats.target_passes == 5


# ------------------------------------------------------------------ sampling: end to end


def test_first_two_tokens_follow_the_targets_distribution():
    def tiny(seed):
        torch.manual_seed(seed)
        return GPT(ModelConfig.preset("tiny", vocab_size=5, max_len=8, d_model=32, n_layers=1, n_heads=2,
                                      tie_embeddings=False)).eval()

    target, draft, prompt, temperature = tiny(4), tiny(5), torch.tensor([[1, 3]]), 0.3

    def joint(model):  # P(first = a, second = b) = p(a | prompt) p(b | prompt, a), by plain forward passes
        with torch.no_grad():
            first = sampling_probs(model(prompt)[0, -1], temperature)
            extended = torch.cat([prompt.repeat(5, 1), torch.arange(5)[:, None]], 1)
            return first[:, None] * sampling_probs(model(extended)[:, -1], temperature)

    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(5, 5, dtype=torch.long)
    proposed = accepted = 0
    for _ in range(1000):  # k = 2 over 3 tokens: both of the first two may be accepted proposals
        out, stats = speculative_generate(target, draft, prompt, 3, k=2, temperature=temperature, generator=g)
        counts[out[0, 2], out[0, 3]] += 1
        proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    assert 0.5 < accepted / proposed < 0.95  # both the accept and the residual path are taken often
    assert fits(counts, joint(target))  # 25 cells, 24 degrees of freedom, significance 1e-3
    assert not fits(counts, joint(draft))  # power: the draft's own distribution is rejected


# ------------------------------------------------------------------ Hugging Face assisted generation


def _hf_gpt2(n_layer: int):
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=n_layer, n_head=4, n_positions=64,
                                     bos_token_id=0, eos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_matches_hugging_face_assisted_generation(k):
    hf_target, hf_draft = _hf_gpt2(3), _hf_gpt2(1)
    hf_draft.load_state_dict(hf_target.state_dict(), strict=False)  # the target's first block: agrees sometimes
    ids = torch.randint(0, 97, (1, 7), generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = hf_target.generate(ids, assistant_model=hf_draft, do_sample=False, max_new_tokens=24,
                                      num_assistant_tokens=k, num_assistant_tokens_schedule="constant")
    out, stats = speculative_generate(GPT.from_hf(hf_target), GPT.from_hf(hf_draft), ids, 24, k=k, temperature=0)
    assert torch.equal(out, expected)
    assert 0 < stats.acceptance_rate < 1


# ------------------------------------------------------------------ bad arguments


def test_bad_arguments():
    target = _gpt(0)
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        speculative_generate(target, target, PROMPT, 4, k=0)
    with pytest.raises(ValueError, match="draft.config.vocab_size must equal target.config.vocab_size=50, got 60"):
        speculative_generate(target, _gpt(0, vocab_size=60), PROMPT, 4)
    with pytest.raises(ValueError, match=r"ids must have shape \(1, prompt_len >= 1\).*got \(2, 5\)"):
        speculative_generate(target, target, PROMPT.repeat(2, 1), 4)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        speculative_generate(target, target, PROMPT, 0)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        speculative_generate(target, target, PROMPT, 4, temperature=-1.0)
    with pytest.raises(ValueError, match="exceeds draft's max_len=16"):
        speculative_generate(target, _gpt(0, max_len=16), PROMPT, 20)
    with pytest.raises(TypeError, match="draft must be a companion GPT"):
        speculative_generate(target, torch.nn.Linear(2, 2), PROMPT, 4)
    assert SpeculativeStats().acceptance_rate != SpeculativeStats().acceptance_rate  # NaN: nothing proposed


# ------------------------------------------------------------------ accelerators (skipped on CPU-only machines)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_greedy_identity_and_sampling():
    target = _gpt(0, n_layers=3).cuda()
    draft = _draft(target, "shallow")
    ids = PROMPT.cuda()
    out, _ = speculative_generate(target, draft, ids, 20, k=3, temperature=0)
    assert out.device.type == "cuda" and torch.equal(out, generate(target, ids, 20, temperature=0))
    out, stats = speculative_generate(target, draft, ids, 20, k=3,
                                      generator=torch.Generator("cuda").manual_seed(0))
    assert out.shape == (1, 25) and stats.generated == 20
