"""Tests for companion.embeddings: skip-gram with negative sampling, nearest words, analogies."""

from __future__ import annotations

import math
import random

import pytest
import torch
import torch.nn.functional as F

from companion.embeddings import (
    SkipGram,
    Word2Vec,
    build_vocab,
    corpus_words,
    keep_probabilities,
    noise_distribution,
    skipgram_pairs,
)

FRUIT = ["apple", "pear", "plum", "fig", "grape", "cherry"]
WEAPONS = ["sword", "spear", "axe", "bow", "dagger", "lance"]
FILLER = ["the", "a", "of", "and"]


@pytest.fixture(scope="module")
def topic_model() -> Word2Vec:
    # Sentences about one topic at a time: a word's contexts are its own topic's words (and filler).
    rng = random.Random(0)
    words = []
    for _ in range(1500):
        topic = rng.choice([FRUIT, WEAPONS])
        for _ in range(8):
            words.append(rng.choice(topic) if rng.random() < 0.7 else rng.choice(FILLER))
    return Word2Vec.train(words, dim=16, window=3, negatives=4, min_count=1, subsample=1.0, epochs=3,
                          batch_size=256, lr=0.02, seed=0, device="cpu")


def test_corpus_words_drops_speakers_punctuation_and_case():
    text = "KING LEAR:\nNothing will come of nothing: speak again.\n\nCORDELIA:\nUnhappy that I am, I cannot 2"
    assert corpus_words(text) == ["nothing", "will", "come", "of", "nothing", "speak", "again", "unhappy", "that",
                                  "i", "am", "i", "cannot"]
    assert corpus_words(text, drop_speaker_lines=False)[:2] == ["king", "lear"]
    with pytest.raises(TypeError, match="text must be a str"):
        corpus_words(["a"])


def test_build_vocab_orders_by_count_then_word():
    itos, counts = build_vocab(["b", "a", "b", "c", "a", "b", "d"], min_count=2)
    assert itos == ["b", "a"] and counts.tolist() == [3, 2]
    with pytest.raises(ValueError, match="min_count must be an int >= 1"):
        build_vocab(["a"], min_count=0)
    with pytest.raises(ValueError, match="no word occurs at least min_count=5 times"):
        build_vocab(["a"], min_count=5)


def test_keep_probabilities_formula():
    counts = torch.tensor([1, 4, 95])  # relative frequencies 0.01, 0.04, 0.95
    keep = keep_probabilities(counts, threshold=0.01)
    expected = torch.tensor([1.0, 0.5, (0.01 / 0.95) ** 0.5])
    assert torch.allclose(keep, expected)
    with pytest.raises(ValueError, match="threshold must be > 0"):
        keep_probabilities(counts, 0.0)


def test_noise_distribution_is_three_quarter_power():
    counts = torch.tensor([16, 1])
    p = noise_distribution(counts)
    assert torch.allclose(p, torch.tensor([8 / 9, 1 / 9]))  # 16**0.75 = 8
    assert p[1] > 1 / 17  # rare words are drawn more often than their frequency


def test_skipgram_pairs_match_a_loop():
    ids = torch.arange(10, 30)
    window = 3
    centres, contexts = skipgram_pairs(ids, window, torch.Generator().manual_seed(1))
    radius = torch.randint(1, window + 1, (len(ids),), generator=torch.Generator().manual_seed(1))
    expected = sorted(
        (ids[i].item(), ids[j].item())
        for i in range(len(ids))
        for j in range(max(0, i - radius[i]), min(len(ids), i + radius[i] + 1))
        if j != i
    )
    assert sorted(zip(centres.tolist(), contexts.tolist())) == expected


def test_skipgram_pairs_window_one_and_bad_input():
    centres, contexts = skipgram_pairs(torch.tensor([1, 2, 3]), 1)
    assert sorted(zip(centres.tolist(), contexts.tolist())) == [(1, 2), (2, 1), (2, 3), (3, 2)]
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        skipgram_pairs(torch.tensor([1, 2]), 0)
    with pytest.raises(ValueError, match="ids must be 1-D"):
        skipgram_pairs(torch.zeros(2, 2, dtype=torch.long), 2)


def test_skipgram_loss_is_the_negative_sampling_objective():
    torch.manual_seed(0)
    model = SkipGram(20, 8)
    torch.nn.init.normal_(model.output.weight)  # zero at init would make every score 0
    centres, contexts = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    negatives = torch.tensor([[7, 8], [9, 10], [11, 12]])
    v = model.input.weight[centres]
    pos = (model.output.weight[contexts] * v).sum(-1)
    neg = torch.einsum("bkd,bd->bk", model.output.weight[negatives], v)
    expected = -(F.logsigmoid(pos) + F.logsigmoid(-neg).sum(-1)).mean()
    assert torch.allclose(model(centres, contexts, negatives), expected)
    with pytest.raises(ValueError, match="negatives must be"):
        model(centres, contexts, negatives[:2])
    with pytest.raises(ValueError, match="centres and contexts must be 1-D of the same shape"):
        model(centres, contexts[:2], negatives)


def test_softmax_loss_matches_cross_entropy_over_the_vocabulary():
    torch.manual_seed(0)
    model = SkipGram(12, 5)
    torch.nn.init.normal_(model.output.weight)
    centres, contexts = torch.tensor([0, 3, 7, 7]), torch.tensor([1, 2, 11, 0])
    # p(c | w) = exp(u_c . v_w) / sum_j exp(u_j . v_w), computed term by term.
    expected = []
    with torch.no_grad():
        for w, c in zip(centres.tolist(), contexts.tolist()):
            scores = [(model.output.weight[j] @ model.input.weight[w]).item() for j in range(12)]
            expected.append(-scores[c] + math.log(sum(math.exp(s) for s in scores)))
    assert model.softmax_loss(centres, contexts).item() == pytest.approx(sum(expected) / 4, rel=1e-5)
    with pytest.raises(ValueError, match="centres and contexts must be 1-D of the same shape"):
        model.softmax_loss(centres, contexts[:2])
    with pytest.raises(TypeError, match="centres and contexts must be torch.Tensor"):
        model.softmax_loss([0, 1], contexts[:2])


def test_softmax_gradient_reaches_every_output_vector_and_negative_sampling_only_the_sampled():
    torch.manual_seed(0)
    model = SkipGram(50, 4)
    torch.nn.init.normal_(model.output.weight)
    centres, contexts, negatives = torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([[4, 5], [6, 7]])
    model.softmax_loss(centres, contexts).backward()
    assert (model.output.weight.grad.abs().sum(1) > 0).all()  # all V rows of U
    # The gradient of the softmax loss with respect to v_w is -u_c + E_{j ~ p(.|w)}[u_j].
    v, u = model.input.weight[0], model.output.weight
    expected = (-u[2] + torch.softmax(u @ v, 0) @ u) / 2  # the batch mean divides by 2
    assert torch.allclose(model.input.weight.grad[0], expected, atol=1e-6)
    model.zero_grad()
    model(centres, contexts, negatives).backward()
    touched = (model.output.weight.grad.abs().sum(1) > 0).nonzero()[:, 0].tolist()
    assert touched == [2, 3, 4, 5, 6, 7]  # only the contexts and the noise words


def test_training_keeps_the_context_vectors(topic_model):
    assert topic_model.context_vectors is not None
    assert topic_model.context_vectors.shape == topic_model.vectors.shape
    assert not torch.equal(topic_model.context_vectors, torch.zeros_like(topic_model.vectors))  # trained from 0
    with pytest.raises(ValueError, match="context_vectors must have the shape of vectors"):
        Word2Vec(["a", "b"], torch.eye(2), context_vectors=torch.zeros(3, 2))


def test_the_training_loop_is_skipgram_with_negative_sampling():
    """Word2Vec.train equals the loop written out step by step (the chapter's version)."""
    words = [random.Random(1).choice(FRUIT + WEAPONS + FILLER) for _ in range(3000)]
    itos, counts = build_vocab(words, min_count=1)
    stoi = {w: i for i, w in enumerate(itos)}
    ids = torch.tensor([stoi[w] for w in words])
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    model = SkipGram(len(itos), 8)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    keep, noise = keep_probabilities(counts, 0.05), noise_distribution(counts)
    step, total = 0, None
    for _ in range(2):
        kept = ids[torch.rand(len(ids), generator=g) < keep[ids]]
        centres, contexts = skipgram_pairs(kept, 3, g)
        order = torch.randperm(len(centres), generator=g)
        centres, contexts = centres[order], contexts[order]
        negatives = torch.multinomial(noise, len(centres) * 4, replacement=True, generator=g).view(-1, 4)
        total = total or 2 * math.ceil(len(centres) / 512)
        for s in range(0, len(centres), 512):
            for group in optimizer.param_groups:
                group["lr"] = 0.02 * max(0.0, 1 - step / total)
            loss = model(centres[s:s + 512], contexts[s:s + 512], negatives[s:s + 512])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
    trained = Word2Vec.train(words, dim=8, window=3, negatives=4, min_count=1, subsample=0.05, epochs=2,
                             batch_size=512, lr=0.02, seed=5, device="cpu")
    assert trained.itos == itos
    assert torch.allclose(trained.vectors, model.input.weight.detach(), atol=1e-5)
    assert torch.allclose(trained.context_vectors, model.output.weight.detach(), atol=1e-5)


def test_training_groups_words_that_share_contexts(topic_model):
    for word, own, other in (("apple", FRUIT, WEAPONS), ("sword", WEAPONS, FRUIT)):
        neighbours = [w for w, _ in topic_model.nearest(word, k=5)]
        assert set(neighbours) <= set(own) - {word}, neighbours
        assert topic_model.similarity(word, own[1]) > topic_model.similarity(word, other[1]) + 0.3


def test_training_is_deterministic():
    words = ["a", "b", "c", "a", "b"] * 40
    one = Word2Vec.train(words, dim=4, min_count=1, subsample=1.0, epochs=1, batch_size=64, seed=3, device="cpu")
    two = Word2Vec.train(words, dim=4, min_count=1, subsample=1.0, epochs=1, batch_size=64, seed=3, device="cpu")
    assert torch.equal(one.vectors, two.vectors)


def test_nearest_and_analogy_on_known_vectors():
    # Orthonormal "royal", "human", "male", "female", "fruit" axes; each word is the sum of two,
    # so that queen - king + man = woman exactly and every vector has the same norm.
    royal, human, male, female, fruit = torch.eye(5)
    itos = ["king", "queen", "man", "woman", "apple"]
    vectors = torch.stack([royal + male, royal + female, human + male, human + female, fruit])
    model = Word2Vec(itos, vectors)
    result = model.analogy("king", "queen", "man", k=2)
    assert result[0] == ("woman", pytest.approx(1.0))
    nearest = model.nearest("king", k=4)
    assert {w for w, _ in nearest[:2]} == {"queen", "man"} and nearest[0][1] == pytest.approx(0.5)
    assert {w for w, _ in nearest[2:]} == {"woman", "apple"} and nearest[2][1] == pytest.approx(0.0)
    assert model.similarity("king", "queen") == pytest.approx(0.5)
    assert torch.equal(model.vector("apple"), vectors[4])
    assert len(model.nearest("king", k=100)) == 4  # at most every other word


def test_most_similar_generalises_nearest_and_analogy():
    royal, human, male, female, fruit = torch.eye(5)
    itos = ["king", "queen", "man", "woman", "apple"]
    model = Word2Vec(itos, torch.stack([royal + male, royal + female, human + male, human + female, fruit]))
    assert model.most_similar(["king", "man"], ["queen"], k=2) == model.analogy("queen", "king", "man", k=2)
    assert model.most_similar(["queen", "man"], ["king"], k=1)[0] == ("woman", pytest.approx(1.0))
    assert model.most_similar(["king"], k=4) == model.nearest("king", k=4)
    # b + c without - a (Linzen's "ignore a" baseline): queen + man is equally near king and woman.
    ignore_a = model.most_similar(["queen", "man"], k=2)
    assert {w for w, _ in ignore_a} == {"king", "woman"}
    assert ignore_a[0][1] == pytest.approx(ignore_a[1][1]) == pytest.approx(1 / math.sqrt(2))
    # Query words and excluded words are never answers.
    assert [w for w, _ in model.most_similar(["queen", "man"], k=5, exclude=["king"])] == ["woman", "apple"]
    # rank is the position in the full most_similar list.
    full = [w for w, _ in model.most_similar(["queen", "man"], ["king"], k=5)]
    assert [model.rank(w, ["queen", "man"], ["king"]) for w in full] == [1, 2]
    assert model.rank("apple", ["king"], exclude=["queen"]) == 2  # man 0.5, then woman and apple tie at 0
    with pytest.raises(ValueError, match="answer='king' is a query or excluded word"):
        model.rank("king", ["queen", "man"], ["king"])
    with pytest.raises(ValueError, match="positive must hold at least one word"):
        model.most_similar([])
    with pytest.raises(TypeError, match="positive must be a sequence of words"):
        model.most_similar("king")
    with pytest.raises(ValueError, match="negative word='zebra' is not in the vocabulary"):
        model.most_similar(["king"], ["zebra"])
    with pytest.raises(ValueError, match="excluded word='zebra' is not in the vocabulary"):
        model.most_similar(["king"], exclude=["zebra"])


def test_unknown_words_and_bad_arguments():
    model = Word2Vec(["a", "b"], torch.eye(2))
    with pytest.raises(ValueError, match="word='zebra' is not in the vocabulary"):
        model.nearest("zebra")
    with pytest.raises(ValueError, match="c='zebra' is not in the vocabulary"):
        model.analogy("a", "b", "zebra")
    with pytest.raises(TypeError, match="word must be a str"):
        model.vector(3)
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        model.nearest("a", k=0)
    with pytest.raises(ValueError, match="vectors must be"):
        Word2Vec(["a", "b", "c"], torch.eye(2))
    with pytest.raises(TypeError, match="words must be a sequence of str"):
        Word2Vec.train("a single string", device="cpu")
    with pytest.raises(ValueError, match="dim must be an int >= 1"):
        Word2Vec.train(["a"], dim=0, device="cpu")
    with pytest.raises(ValueError, match="no training pairs"):
        Word2Vec.train(["a", "b"] * 5, min_count=1, subsample=1e-6, device="cpu")
    with pytest.raises(ValueError, match="cpu_threads must be None or an int >= 1"):
        Word2Vec.train(["a"], cpu_threads=0, device="cpu")
    for bad_lr in (0.0, -0.1, float("inf"), "0.02"):
        with pytest.raises(ValueError, match="lr must be a positive finite number"):
            Word2Vec.train(["a", "b"] * 5, lr=bad_lr, device="cpu")
    with pytest.raises(ValueError, match="subsample must be a positive finite number"):
        Word2Vec.train(["a", "b"] * 5, subsample=0, device="cpu")
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        Word2Vec.train(["a", "b"] * 5, window=0, device="cpu")


def test_training_restores_thread_count():
    before = torch.get_num_threads()
    Word2Vec.train(["a", "b"] * 20, dim=2, min_count=1, subsample=1.0, epochs=1, cpu_threads=1, device="cpu")
    assert torch.get_num_threads() == before
