"""Tests for companion.ngram: distributions sum to 1, counts match a brute-force model, baselines order."""

import math
from collections import Counter

import pytest
import torch

from companion.ngram import NGramLM, ngram_cross_entropy


def interpolate(counts, order, discount, context, token, p):
    """Interpolate the levels 2..order of ``counts(k)`` (k-gram -> count) on top of the level-1 probability ``p``."""
    for k in range(2, order + 1):
        grams = counts(k)
        h = tuple(context[len(context) - (k - 1) :])
        c_h = sum(c for g, c in grams.items() if g[:-1] == h)
        if c_h == 0:
            continue
        n1 = sum(1 for g in grams if g[:-1] == h)
        p = max(grams[h + (token,)] - discount, 0) / c_h + discount * n1 / c_h * p
    return p


def brute_force_prob(train, order, vocab, discount, context, token):
    """The same smoothing written with Counters, one probability at a time."""
    n = len(train)
    p = (train.count(token) + 1) / (n + vocab)

    def counts(k):  # every level counts occurrences
        return Counter(tuple(train[i : i + k]) for i in range(n - k + 1))

    return interpolate(counts, order, discount, context, token, p)


def brute_force_kneser_ney(train, order, vocab, discount, context, token):
    """Interpolated Kneser-Ney written with Counters: continuation counts below the highest order."""
    n = len(train)

    def counts(k):  # k-gram -> its count at level k (occurrences at the top, distinct left contexts below)
        if k == order:
            return Counter(tuple(train[i : i + k]) for i in range(n - k + 1))
        left = {tuple(train[i : i + k + 1]) for i in range(n - k)}
        return Counter(g[1:] for g in left)

    unigram = counts(1)
    total = sum(unigram.values())
    p = max(unigram[(token,)] - discount, 0) / total + discount * len(unigram) / total / vocab
    return interpolate(counts, order, discount, context, token, p)


@pytest.mark.parametrize("order", [2, 3, 4])
def test_kneser_ney_matches_brute_force_and_sums_to_one(order):
    g = torch.Generator().manual_seed(10 + order)
    train = torch.randint(0, 6, (80,), generator=g).tolist()
    lm = NGramLM(train, order, 6, smoothing="kneser_ney")
    for ctx in ([0, 1, 2], [5, 5, 5], [3, 1, 4], [2, 2, 0]):
        ctx = ctx[3 - (order - 1) :]
        probs = lm.prob(torch.tensor([ctx] * 6).reshape(6, order - 1), torch.arange(6))
        assert probs.sum().item() == pytest.approx(1.0, abs=1e-9)
        for w in range(6):
            assert probs[w].item() == pytest.approx(brute_force_kneser_ney(train, order, 6, 0.75, ctx, w), abs=1e-12)


def test_kneser_ney_gives_less_to_tokens_seen_after_one_context():
    # "b" is frequent but only ever follows "a"; "c" is rarer but follows many tokens. After an
    # unseen context, Kneser-Ney's continuation counts favour "c"; absolute discounting favours "b".
    a, b, c, d, e = range(5)
    train = [a, b] * 20 + [d, c, e, c, a, c, d, e] * 2
    ctx, tokens = torch.tensor([[e], [e]]), torch.tensor([b, c])  # e is never followed by b
    abs_b, abs_c = NGramLM(train, 2, 5).prob(ctx, tokens).tolist()
    kn_b, kn_c = NGramLM(train, 2, 5, smoothing="kneser_ney").prob(ctx, tokens).tolist()
    assert abs_b > kn_b and kn_c > abs_c


@pytest.mark.parametrize("order", [1, 2, 3])
def test_matches_brute_force_and_sums_to_one(order):
    g = torch.Generator().manual_seed(order)
    train = torch.randint(0, 5, (60,), generator=g).tolist()
    lm = NGramLM(train, order, 5)
    contexts = [[0, 1], [4, 4], [2, 3], [3, 3]] if order == 3 else [[0], [4], [2]] if order == 2 else [[]]
    for ctx in contexts:
        probs = lm.prob(torch.tensor([ctx] * 5).reshape(5, order - 1), torch.arange(5))
        assert probs.sum().item() == pytest.approx(1.0, abs=1e-9)
        for w in range(5):
            assert probs[w].item() == pytest.approx(brute_force_prob(train, order, 5, 0.75, ctx, w), abs=1e-12)


def test_unseen_contexts_back_off_and_nothing_is_impossible():
    lm = NGramLM([0, 1, 0, 1, 0, 1], 2, 3)
    assert lm.prob(torch.tensor([[2]]), torch.tensor([2])).item() == pytest.approx(1 / 9)  # unigram (0+1)/(6+3)
    assert math.isfinite(lm.cross_entropy([2, 2, 2, 0]))


def test_higher_orders_help_on_structured_text():
    text = torch.tensor([0, 1, 2, 3] * 200)  # deterministic given the previous token
    noisy = text.clone()
    noisy[::7] = 4
    losses = [ngram_cross_entropy(noisy[:600], noisy[600:], order, 5) for order in (1, 2, 3)]
    assert losses[0] > losses[1] > losses[2] and losses[0] == pytest.approx(math.log(5), abs=0.1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="order must be an int >= 1"):
        NGramLM([1, 2], 0, 3)
    with pytest.raises(ValueError, match=r"discount must be a number in \(0, 1\)"):
        NGramLM([1, 2], 2, 3, discount=1.0)
    with pytest.raises(ValueError, match=r"train_ids must lie in \[0, 3\)"):
        NGramLM([1, 3], 2, 3)
    with pytest.raises(ValueError, match="must fit in int64"):
        NGramLM([1, 2], 5, 50257)
    with pytest.raises(ValueError, match="smoothing must be one of"):
        NGramLM([1, 2], 2, 3, smoothing="witten_bell")
    with pytest.raises(ValueError, match="train_ids must be a 1-D sequence"):
        NGramLM(torch.zeros(2, 2, dtype=torch.long), 2, 3)
    with pytest.raises(ValueError, match="ids must hold more than order - 1 = 2 tokens"):
        NGramLM([0, 1, 2, 0], 3, 3).cross_entropy([0, 1])


@pytest.mark.parametrize("smoothing", ["absolute", "kneser_ney"])
def test_window_nll_cuts_the_context_at_the_window_start(smoothing):
    g = torch.Generator().manual_seed(3)
    train = torch.randint(0, 5, (300,), generator=g)
    text = torch.randint(0, 5, (200,), generator=g)
    starts = torch.tensor([0, 17, 90, 150])
    windows = text[starts[:, None] + torch.arange(9)]
    x, y = windows[:, :-1], windows[:, 1:]  # as lm_batch cuts them
    lm = NGramLM(train, 3, 5, smoothing=smoothing)
    nll = lm.window_nll(x, y)
    assert nll.shape == (4, 8) and nll.dtype == torch.float64
    # one position at a time, with a separately fitted model of the order the context allows
    for t in range(8):
        k = min(3, t + 2)
        other = NGramLM(train, k, 5, smoothing=smoothing)
        for w in range(4):
            context = x[w, t + 2 - k : t + 1].reshape(1, k - 1)
            expected = -math.log(other.prob(context, y[w, t : t + 1]).item())
            assert nll[w, t].item() == pytest.approx(expected, abs=1e-12)
    # from the second position on the full order is used, and the first prediction sees one token only
    assert torch.allclose(nll[:, 1:], -lm.prob(windows.unfold(1, 3, 1)[:, :, :2].reshape(-1, 2),
                                               y[:, 1:].reshape(-1)).log().reshape(4, 7))
    assert not torch.allclose(nll[:, 0], -lm.prob(torch.stack([text[(starts - 1).clamp(min=0)], x[:, 0]], 1),
                                                  y[:, 0]).log())


def test_window_nll_bad_arguments():
    lm = NGramLM([0, 1, 2, 0, 1], 2, 3)
    with pytest.raises(ValueError, match=r"must be \(windows, seq\) of one shape"):
        lm.window_nll(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 3\)"):
        lm.window_nll(torch.zeros(1, 2, dtype=torch.long), torch.full((1, 2), 3))
