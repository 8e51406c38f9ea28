"""Tests for companion.evaluation: text statistics against hand counts and brute force, NLL against HF."""

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.config import ModelConfig
from companion.evaluation import bits_per_character, continuation_nll, distinct_n, repeat_rate, stream_nll
from companion.generation import generate
from companion.models.gpt import GPT


def test_distinct_n_by_hand():
    assert distinct_n([[1, 2, 3, 1, 2]], 1) == pytest.approx(3 / 5)
    assert distinct_n([[1, 2, 3, 1, 2]], 2) == pytest.approx(3 / 4)  # (1,2) twice
    # pooled over samples: the same bigram in two samples counts once
    assert distinct_n([[5, 6], [5, 6], [6, 5]], 2) == pytest.approx(2 / 3)
    assert distinct_n(torch.tensor([[0, 1, 2, 3]]), 2) == 1.0


def test_distinct_n_matches_brute_force_and_ignores_order_of_samples():
    g = torch.Generator().manual_seed(0)
    samples = torch.randint(0, 6, (7, 30), generator=g)
    for n in (1, 2, 3):
        grams = [tuple(row[i : i + n]) for row in samples.tolist() for i in range(len(row) - n + 1)]
        assert distinct_n(samples, n) == pytest.approx(len(set(grams)) / len(grams))
        assert distinct_n(samples.flip(0), n) == pytest.approx(distinct_n(samples, n))


def test_repeat_rate_by_hand():
    assert repeat_rate([[1, 2, 1, 2, 1, 2]], 2) == pytest.approx(1 - 2 / 5)
    assert repeat_rate([[1, 2, 3, 4, 5]], 1) == 0.0
    assert repeat_rate([[7] * 11], 4) == pytest.approx(1 - 1 / 8)
    # averaged per sample, not pooled: a loop and a sample without repeats give their mean
    assert repeat_rate([[1, 1, 1, 1, 1], [1, 2, 3, 4, 5]], 1) == pytest.approx((1 - 1 / 5 + 0) / 2)
    # repeats across samples do not count
    assert repeat_rate([[1, 2, 3], [1, 2, 3]], 1) == 0.0


def test_repeat_rate_matches_brute_force_and_skips_short_samples():
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 4, (int(length),), generator=g).tolist() for length in (12, 3, 25, 9)]
    expected = []
    for row in rows:
        grams = Counter(tuple(row[i : i + 4]) for i in range(len(row) - 3))
        if grams:
            expected.append(sum(c - 1 for c in grams.values()) / sum(grams.values()))
    assert repeat_rate(rows, 4) == pytest.approx(sum(expected) / len(expected))
    assert len(expected) == 3  # the 3-token sample has no 4-gram


@pytest.mark.parametrize("bad", [torch.zeros(2, 3), torch.zeros(3, dtype=torch.long), "abc", [[1, 2.5]], 7])
def test_text_statistics_reject_bad_input(bad):
    with pytest.raises((ValueError, TypeError), match="sequences"):
        distinct_n(bad, 1)
    with pytest.raises((ValueError, TypeError), match="sequences"):
        repeat_rate(bad, 1)


def test_text_statistics_reject_bad_n_and_empty():
    with pytest.raises(ValueError, match="n must be"):
        distinct_n([[1, 2]], 0)
    with pytest.raises(ValueError, match="n must be"):
        repeat_rate([[1, 2]], True)
    with pytest.raises(ValueError, match="no 3-gram"):
        distinct_n([[1, 2], [3]], 3)
    with pytest.raises(ValueError, match="no 4-gram"):
        repeat_rate([[1, 2, 3]], 4)


def _tiny_gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(ModelConfig.preset("tiny", vocab_size=50, d_model=32, n_heads=2, max_len=64)).eval()


def test_continuation_nll_matches_loop_over_positions():
    model = _tiny_gpt()
    ids = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(2))
    prompt_len = 4
    got = continuation_nll(model, ids, prompt_len)
    with torch.no_grad():
        expected = torch.stack([
            torch.stack([-model(ids[b : b + 1, :t])[0, -1].log_softmax(-1)[ids[b, t]]
                         for t in range(prompt_len, 12)]).mean()
            for b in range(3)
        ])
    assert got.shape == (3,)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_continuation_nll_with_prompt_len_one_is_the_model_loss():
    model = _tiny_gpt(1)
    ids = torch.randint(0, 50, (4, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        loss = model.loss(ids[:, :-1], ids[:, 1:])
    assert continuation_nll(model, ids, 1).mean().item() == pytest.approx(loss.item(), abs=1e-5)


def test_continuation_nll_of_a_uniform_model_is_log_vocab():
    class Uniform(nn.Module):
        def forward(self, ids):
            return torch.zeros(*ids.shape, 37)

    ids = torch.randint(0, 37, (2, 9))
    torch.testing.assert_close(continuation_nll(Uniform(), ids, 3), torch.full((2,), math.log(37)))


def test_continuation_nll_matches_hugging_face_gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=32, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits = hf(ids).logits
    expected = F.cross_entropy(logits[:, 5:-1].transpose(1, 2), ids[:, 6:], reduction="none").mean(1)
    torch.testing.assert_close(continuation_nll(GPT.from_hf(hf), ids, 6), expected, atol=1e-5, rtol=1e-5)


def test_greedy_text_is_more_likely_to_the_model_than_its_samples():
    model = _tiny_gpt(3)
    prompt = torch.randint(0, 50, (8, 4), generator=torch.Generator().manual_seed(5))
    greedy = generate(model, prompt, 20, temperature=0)
    sampled = generate(model, prompt, 20, generator=torch.Generator().manual_seed(6))
    assert continuation_nll(model, greedy, 4).mean() < continuation_nll(model, sampled, 4).mean()


def test_continuation_nll_restores_training_mode_and_checks_input():
    model = _tiny_gpt().train()
    ids = torch.randint(0, 50, (1, 6))
    continuation_nll(model, ids, 2)
    assert model.training
    with pytest.raises(ValueError, match="prompt_len"):
        continuation_nll(model, ids, 6)
    with pytest.raises(ValueError, match="prompt_len"):
        continuation_nll(model, ids, 0)
    with pytest.raises(ValueError, match="ids"):
        continuation_nll(model, ids[0], 2)
    with pytest.raises(ValueError, match="ids"):
        continuation_nll(model, ids.float(), 2)
    with pytest.raises(TypeError, match="model"):
        continuation_nll(lambda x: x, ids, 2)


def test_bits_per_character():
    # 1 nat per token at one token per character is 1 / ln 2 bits per character
    assert bits_per_character(1.0, 100, 100) == pytest.approx(1 / math.log(2))
    # a tokenizer with 4 characters per token spreads a token's loss over 4 characters
    assert bits_per_character(2.0, 25, 100) == pytest.approx(2.0 / 4 / math.log(2))
    for bad in (-1.0, float("inf"), "1", True):
        with pytest.raises(ValueError, match="nats_per_token"):
            bits_per_character(bad, 1, 1)
    with pytest.raises(ValueError, match="n_chars"):
        bits_per_character(1.0, 1, 0)
    with pytest.raises(ValueError, match="n_tokens"):
        bits_per_character(1.0, 0, 1)


class _LastTokenLM(nn.Module):
    """Logits from the current token only (a bigram model): windowing cannot change its predictions."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, vocab)

    def forward(self, ids):
        return self.emb(ids)


@pytest.mark.parametrize("context, stride", [(8, 8), (8, 3), (7, 1), (16, 5), (500, 10)])
def test_stream_nll_scores_every_token_once(context, stride):
    # a model without context gives the same loss per token in any window: if a token were scored
    # twice, or missed, the mean would move (the per-token losses differ)
    torch.manual_seed(0)
    model = _LastTokenLM(11)
    ids = torch.randint(0, 11, (203,))
    full = F.cross_entropy(model(ids[:-1]), ids[1:]).item()
    assert stream_nll(model, ids, context, stride, batch_size=4) == pytest.approx(full, rel=1e-6)


def test_stream_nll_non_overlapping_windows_and_one_window():
    torch.manual_seed(0)
    model = GPT(ModelConfig.preset("tiny", vocab_size=50, max_len=64)).eval()
    ids = torch.randint(0, 50, (16 * 10 + 1,))
    x, y = ids[:-1].view(10, 16), ids[1:].view(10, 16)  # ten windows of 16, every target once
    with torch.no_grad():
        by_hand = model.loss(x, y).item()
    assert stream_nll(model, ids, 16) == pytest.approx(by_hand, rel=1e-5)
    # a stream that fits one window: the plain teacher-forced loss of the whole stream
    short = ids[:40]
    assert stream_nll(model, short, 64, 8) == pytest.approx(continuation_nll(model, short[None], 1).item(), rel=1e-5)


def test_stream_nll_overlap_gives_context_and_restores_mode():
    # a trained-free but context-sensitive check: with stride < context, a token's window differs
    # from the non-overlapping one, and the loss is computed in eval mode without changing the mode
    torch.manual_seed(0)
    model = GPT(ModelConfig.preset("tiny", vocab_size=50, max_len=32, dropout=0.5)).train()
    ids = torch.randint(0, 50, (300,))
    a, b = stream_nll(model, ids, 32, 32), stream_nll(model, ids, 32, 8)
    assert model.training
    assert a != pytest.approx(b, rel=1e-6)  # the windows differ, so does the context of most tokens
    assert stream_nll(model, ids, 32, 8) == b  # eval mode: dropout off, deterministic


@pytest.mark.parametrize("kwargs, match", [
    (dict(ids=torch.zeros(2, 5, dtype=torch.long)), "ids must be a 1-D"),
    (dict(ids=torch.zeros(1, dtype=torch.long)), "at least 2"),
    (dict(context=0), "context"),
    (dict(stride=9), "stride must be <= context = 8"),
    (dict(stride=0), "stride"),
])
def test_stream_nll_rejects_bad_input(kwargs, match):
    args = dict(model=_LastTokenLM(5), ids=torch.zeros(20, dtype=torch.long), context=8, stride=None)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        stream_nll(**args)
