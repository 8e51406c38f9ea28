"""Tests for companion.objectives: MLM masking, NSP pairs, span corruption, i.i.d. corruption, T5 lengths,
distillation."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.objectives import (
    distillation_loss,
    iid_corrupt,
    mlm_mask,
    nsp_pairs,
    pack_pair,
    span_corrupt,
    t5_lengths,
)

SPECIALS = [0, 1, 2, 3]  # pad, [CLS], [SEP], [MASK]


def _batch(seed=0, shape=(64, 128), vocab=50):
    ids = torch.randint(4, vocab, shape, generator=torch.Generator().manual_seed(seed))
    ids[:, 0], ids[:, -1] = 1, 2
    ids[: shape[0] // 2, -20:] = 0  # padding
    return ids


def test_mlm_mask_rates_and_invariants():
    ids = _batch()
    inputs, labels = mlm_mask(ids, vocab_size=50, mask_id=3, special_ids=SPECIALS,
                              generator=torch.Generator().manual_seed(1))
    chosen = labels != -100
    candidates = ~torch.isin(ids, torch.tensor(SPECIALS))
    assert not (chosen & ~candidates).any()  # specials and padding are never chosen
    assert torch.equal(labels[chosen], ids[chosen])
    assert abs(chosen.sum().item() / candidates.sum().item() - 0.15) < 0.01
    masked = chosen & (inputs == 3)
    changed = chosen & (inputs != ids) & (inputs != 3)
    kept = chosen & (inputs == ids)
    n = chosen.sum().item()
    assert abs(masked.sum().item() / n - 0.8) < 0.03 and abs(changed.sum().item() / n - 0.1) < 0.03
    assert abs(kept.sum().item() / n - 0.1) < 0.035  # includes random draws of the same token (1/46)
    assert not torch.isin(inputs[changed], torch.tensor(SPECIALS)).any()  # random replacements are never special
    assert torch.equal(inputs[~chosen], ids[~chosen])


def test_static_and_dynamic_masking():
    ids = _batch(shape=(4, 64))
    a = mlm_mask(ids, vocab_size=50, mask_id=3, special_ids=SPECIALS, generator=torch.Generator().manual_seed(5))
    b = mlm_mask(ids, vocab_size=50, mask_id=3, special_ids=SPECIALS, generator=torch.Generator().manual_seed(5))
    c = mlm_mask(ids, vocab_size=50, mask_id=3, special_ids=SPECIALS, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[1], c[1])  # static: fixed once; dynamic: fresh draws


def test_whole_word_masking_masks_all_pieces_of_a_word():
    ids = torch.randint(4, 50, (8, 40), generator=torch.Generator().manual_seed(0))
    word_ids = (torch.arange(40) // 3).repeat(8, 1)  # every word is 3 pieces
    _, labels = mlm_mask(ids, vocab_size=50, mask_id=3, special_ids=SPECIALS, word_ids=word_ids, mask_prob=0.3,
                         generator=torch.Generator().manual_seed(2))
    chosen = (labels != -100).view(8, -1)[:, :39].reshape(8, 13, 3)
    assert chosen.any() and (chosen.all(-1) | ~chosen.any(-1)).all()  # all pieces of a word, or none


def test_nsp_pairs_and_packing():
    passages = [[10 * i + j for j in range(3)] for i in range(20)]
    pairs = nsp_pairs(passages, 400, generator=torch.Generator().manual_seed(0))
    nexts = [(a, b) for a, b, label in pairs if label == 0]
    assert 150 < len(nexts) < 250
    assert all(b[0] == a[0] + 10 for a, b in nexts)  # consecutive passages
    assert all(b[0] != a[0] + 10 for a, b, label in pairs if label == 1)
    ids, segments = pack_pair([5, 6, 7], [8, 9], cls_id=1, sep_id=2, max_len=8)
    assert ids == [1, 5, 6, 7, 2, 8, 9, 2] and segments == [0, 0, 0, 0, 0, 1, 1, 1]
    ids, _ = pack_pair(list(range(10, 20)), [8, 9], cls_id=1, sep_id=2, max_len=8)
    assert ids == [1, 10, 11, 12, 2, 8, 9, 2]  # the longer passage loses tokens from its end
    ids, _ = pack_pair([5, 6, 7], [8, 9, 10], cls_id=1, sep_id=2, max_len=8)
    assert ids == [1, 5, 6, 2, 8, 9, 10, 2]  # a tie shortens a first


def test_pack_pair_with_a_generator_trims_both_ends_as_bert_pre_training_does():
    a, b = list(range(100, 140)), list(range(200, 220))
    g = torch.Generator().manual_seed(0)
    firsts, lasts = set(), set()
    for _ in range(200):
        ids, segments = pack_pair(a, b, cls_id=1, sep_id=2, max_len=32, generator=g)
        sep = ids.index(2)
        kept_a, kept_b = ids[1:sep], ids[sep + 1 : -1]
        assert len(ids) == 32 and segments == [0] * (len(kept_a) + 2) + [1] * (len(kept_b) + 1)
        assert len(kept_b) <= len(kept_a) <= len(kept_b) + 1  # the longer shrinks; a tie shortens b
        for kept, whole in ((kept_a, a), (kept_b, b)):
            start = whole.index(kept[0])
            assert kept == whole[start : start + len(kept)]  # a contiguous piece of the passage
        firsts.add(kept_a[0])
        lasts.add(kept_a[-1])
    assert len(firsts) > 5 and len(lasts) > 5  # cut at the front and at the end


@settings(max_examples=40, deadline=None)
@given(length=st.integers(2, 120), density=st.sampled_from([0.15, 0.3, 0.5]), span=st.sampled_from([1.0, 3.0, 5.0]),
       seed=st.integers(0, 1000))
def test_span_corruption_merges_back_into_the_original(length, density, span, seed):
    ids = torch.arange(1000, 1000 + 2 * length).view(2, length)
    sentinels = list(range(99, 0, -1))
    inputs, targets = span_corrupt(ids, noise_density=density, mean_span_length=span, sentinel_ids=sentinels,
                                   generator=torch.Generator().manual_seed(seed))
    n_noise = min(max(round(length * density), 1), length - 1)
    n_spans = min(max(round(n_noise / span), 1), n_noise, length - n_noise)
    assert inputs.shape == (2, length - n_noise + n_spans) and targets.shape == (2, n_noise + n_spans)
    for row_in, row_tgt, original in zip(inputs.tolist(), targets.tolist(), ids.tolist()):
        spans, current = {}, None
        for tok in row_tgt:
            if tok < 100:
                current = tok
                spans[current] = []
            else:
                spans[current].append(tok)
        merged = [t for tok in row_in for t in (spans[tok] if tok < 100 else [tok])]
        assert merged == original
        assert all(len(s) >= 1 for s in spans.values()) and row_tgt[0] == 99


def test_span_corruption_targets_are_shorter_and_t5_lengths_match_the_papers_setup():
    assert t5_lengths(512) == (568, 114)  # T5 / HF run_t5_mlm: 568 raw tokens for 512 inputs
    raw, target_len = t5_lengths(128)
    ids = torch.arange(raw).view(1, raw) + 200
    inputs, targets = span_corrupt(ids, sentinel_ids=list(range(100)), eos_id=199,
                                   generator=torch.Generator().manual_seed(0))
    assert inputs.shape[1] == 128 and targets.shape[1] == target_len
    assert targets.shape[1] < 0.25 * raw  # vs i.i.d. masking, which predicts at the full length


T5_SENTINELS = range(32099, 31999, -1)  # <extra_id_0>, <extra_id_1>, ... as T5's vocabulary numbers them


def _merge(row_in, row_tgt, eos=None, pad=None):
    """Put each target run back in place of its sentinel (ids >= 32000), dropping end and padding."""
    row_in = [t for t in row_in if t not in (eos, pad)]
    spans, current = {}, None
    for tok in row_tgt:
        if tok in (eos, pad):
            continue
        if tok >= 32000:
            current = tok
            spans[current] = []
        else:
            spans[current].append(tok)
    assert all(len(s) >= 1 for s in spans.values())
    return [t for tok in row_in for t in (spans[tok] if tok >= 32000 else [tok])], spans


def test_iid_corrupt_on_a_hand_checked_example():
    # torch.rand((2, 4), generator=seed 0) = [[.496, .768, .088, .132], [.307, .634, .490, .896]]:
    # at density 0.5 the noise is [[x . x x], [x . x .]]
    g = torch.Generator().manual_seed(0)
    assert torch.equal(torch.rand(2, 4, generator=g) < 0.5, torch.tensor([[1, 0, 1, 1], [1, 0, 1, 0]]).bool())
    ids = torch.tensor([[10, 11, 12, 13], [14, 15, 16, 17]])
    inputs, targets = iid_corrupt(ids, noise_density=0.5, sentinel_ids=T5_SENTINELS, eos_id=1, pad_id=0,
                                  generator=torch.Generator().manual_seed(0))
    assert inputs.tolist() == [[32099, 11, 32098, 1, 0], [32099, 15, 32098, 17, 1]]
    assert targets.tolist() == [[32099, 10, 32098, 12, 13, 1], [32099, 14, 32098, 16, 1, 0]]
    # without an end token, and with another padding id
    inputs, targets = iid_corrupt(ids, noise_density=0.5, sentinel_ids=T5_SENTINELS, pad_id=-1,
                                  generator=torch.Generator().manual_seed(0))
    assert inputs.tolist() == [[32099, 11, 32098, -1], [32099, 15, 32098, 17]]
    assert targets.tolist() == [[32099, 10, 32098, 12, 13], [32099, 14, 32098, 16, -1]]


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 80), density=st.sampled_from([0.05, 0.15, 0.5, 0.9]), seed=st.integers(0, 1000))
def test_iid_corrupt_merges_back_into_the_original(length, density, seed):
    ids = torch.arange(100, 100 + 3 * length).view(3, length)
    noise = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed)) < density
    inputs, targets = iid_corrupt(ids, noise_density=density, sentinel_ids=T5_SENTINELS, eos_id=1, pad_id=0,
                                  generator=torch.Generator().manual_seed(seed))
    for row_in, row_tgt, original, row_noise in zip(inputs.tolist(), targets.tolist(), ids.tolist(), noise.tolist()):
        merged, spans = _merge(row_in, row_tgt, eos=1, pad=0)
        assert merged == original
        # the noise is exactly the generator's draw, and each run of it is one span, sentinels in T5's order
        assert sum(len(s) for s in spans.values()) == sum(row_noise)
        assert list(spans) == list(T5_SENTINELS)[: len(spans)]
        assert len(spans) == sum(m and (j == 0 or not row_noise[j - 1]) for j, m in enumerate(row_noise))
        assert row_in[len(original) - sum(row_noise) + len(spans)] == 1 and row_tgt[sum(row_noise) + len(spans)] == 1


def test_iid_corrupt_masks_noise_density_of_the_tokens_in_runs_as_expected():
    ids = torch.randint(100, 200, (200, 500), generator=torch.Generator().manual_seed(1))
    p = 0.15
    inputs, targets = iid_corrupt(ids, noise_density=p, sentinel_ids=T5_SENTINELS, pad_id=0,
                                  generator=torch.Generator().manual_seed(2))
    sentinels = (targets >= 32000).sum().item()
    masked = ((targets > 0) & (targets < 32000)).sum().item()
    assert abs(masked / ids.numel() - p) < 0.005  # sd of the fraction: sqrt(p (1 - p) / 100,000) = 0.0011
    assert abs(sentinels / ids.shape[0] - 500 * p * (1 - p)) < 1.5  # a run starts at a masked token after a clean one
    assert (inputs > 0).sum().item() == ids.numel() - masked + sentinels
    # the same seed gives the same corruption; another seed another
    again = iid_corrupt(ids, noise_density=p, sentinel_ids=T5_SENTINELS, generator=torch.Generator().manual_seed(2))
    other = iid_corrupt(ids, noise_density=p, sentinel_ids=T5_SENTINELS, generator=torch.Generator().manual_seed(3))
    assert torch.equal(again[1], targets) and not torch.equal(other[1], targets)


def test_iid_corrupt_bad_arguments():
    ids = torch.arange(100, 120).view(2, 10)
    with pytest.raises(ValueError, match="ids must be an integer tensor with 2 dims"):
        iid_corrupt(ids[0], sentinel_ids=T5_SENTINELS)
    with pytest.raises(ValueError, match="ids must be an integer tensor"):
        iid_corrupt(ids.float(), sentinel_ids=T5_SENTINELS)
    with pytest.raises(ValueError, match="ids must hold at least 1 token"):
        iid_corrupt(ids[:, :0], sentinel_ids=T5_SENTINELS)
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match=f"noise_density must be in \\(0, 1\\), got {bad}"):
            iid_corrupt(ids, noise_density=bad, sentinel_ids=T5_SENTINELS)
    with pytest.raises(ValueError, match="sentinel_ids holds 1 sentinels, 2 spans need one each"):
        iid_corrupt(torch.tensor([[10, 11, 12, 13]]), noise_density=0.5, sentinel_ids=[32099],
                    generator=torch.Generator().manual_seed(0))  # noise [x . x x]: two runs


def test_distillation_loss_terms():
    torch.manual_seed(0)
    s, t = torch.randn(2, 5, 11), torch.randn(2, 5, 11)
    labels = torch.full((2, 5), -100)
    labels[:, 1] = 3
    hs, ht = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    loss = distillation_loss(s, t, labels, student_hidden=hs, teacher_hidden=ht, temperature=2.0, alpha=5.0,
                             beta=2.0, gamma=1.0)
    kl = F.kl_div((s / 2).log_softmax(-1).flatten(0, 1), (t / 2).softmax(-1).flatten(0, 1), reduction="batchmean")
    mlm = F.cross_entropy(s.flatten(0, 1), labels.flatten())
    cos = 1 - F.cosine_similarity(hs, ht, dim=-1).mean()
    torch.testing.assert_close(loss, 5.0 * 4 * kl + 2.0 * mlm + cos)
    # a student equal to its teacher has zero KL and zero cosine loss
    same = distillation_loss(t, t, labels, student_hidden=ht, teacher_hidden=ht)
    torch.testing.assert_close(same, 2.0 * F.cross_entropy(t.flatten(0, 1), labels.flatten()))


def test_bad_arguments():
    ids = _batch(shape=(2, 10))
    with pytest.raises(ValueError, match="ratios must be three non-negative shares summing to 1"):
        mlm_mask(ids, vocab_size=50, mask_id=3, special_ids=SPECIALS, ratios=(0.8, 0.1, 0.2))
    with pytest.raises(ValueError, match="ids must be an integer tensor with 2 dims"):
        mlm_mask(ids[0], vocab_size=50, mask_id=3, special_ids=SPECIALS)
    with pytest.raises(ValueError, match="sentinel_ids holds 0 sentinels"):
        span_corrupt(ids, sentinel_ids=[])
    with pytest.raises(ValueError, match="passages must hold at least 3"):
        nsp_pairs([[1], [2]], 3)
    with pytest.raises(ValueError, match="student and teacher logits must have one shape"):
        distillation_loss(torch.randn(2, 3, 4), torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long))
