import datetime

import pytest
import torch

from companion.tasks import (
    CopyTask,
    DateTask,
    NumberWordsTask,
    ReverseTask,
    Seq2SeqVocab,
    SortTask,
    pad_sequences,
)

TASKS = [CopyTask(), ReverseTask(), SortTask(), DateTask(), NumberWordsTask()]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_sample_layout(task):
    src, tgt = task.sample(64, torch.Generator().manual_seed(0))
    assert src.dtype == tgt.dtype == torch.long and src.shape[0] == tgt.shape[0] == 64
    assert (tgt[:, 0] == 1).all()  # <bos>
    assert ((tgt == 2).sum(1) == 1).all()  # exactly one <eos>
    assert src.max() < len(task.src_vocab) and tgt.max() < len(task.tgt_vocab)
    for s, t in zip(src[:8], tgt[:8]):
        assert task.src_vocab.decode(s)  # round-trips to tokens
        assert task.tgt_vocab.encode(task.tgt_vocab.decode(t), bos=True, eos=True) == t[t != 0].tolist()


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_seeded_and_splits_disjoint(task):
    a = task.sample(20, torch.Generator().manual_seed(3))
    b = task.sample(20, torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    train = {tuple(s) for s, _ in task.pairs(400, torch.Generator().manual_seed(0), "train")}
    test = {tuple(s) for s, _ in task.pairs(100, torch.Generator().manual_seed(1), "test")}
    assert not train & test


def test_transforms():
    g = torch.Generator().manual_seed(0)
    for s, t in ReverseTask().pairs(20, g):
        assert t == s[::-1]
    for s, t in SortTask().pairs(20, g):
        assert t == sorted(s)
    for s, t in CopyTask(min_len=2, max_len=4).pairs(50, g):
        assert t == s and 2 <= len(s) <= 4


def test_held_out_fraction_is_about_a_tenth():
    from companion.tasks import _held_out
    frac = sum(_held_out(n) for n in range(10000)) / 10000
    assert 0.08 < frac < 0.12


def test_dates():
    task = DateTask()
    for s, t in task.pairs(50, torch.Generator().manual_seed(0), "all"):
        d = datetime.date.fromisoformat("".join(s))
        assert t == [str(d.day), d.strftime("%B").lower(), *str(d.year)]


def test_number_words():
    w = NumberWordsTask.words
    assert w(0) == ["zero"]
    assert w(13) == ["thirteen"]
    assert w(40) == ["forty"]
    assert w(347) == ["three", "hundred", "forty", "seven"]
    assert w(1000) == ["one", "thousand"]
    assert w(12005) == ["twelve", "thousand", "five"]
    assert w(999999) == ["nine", "hundred", "ninety", "nine", "thousand", "nine", "hundred", "ninety", "nine"]
    task = NumberWordsTask(999)
    assert all(int("".join(s)) <= 999 for s, _ in task.pairs(100, torch.Generator().manual_seed(0)))


def test_vocab_and_padding():
    v = Seq2SeqVocab(["x", "y"])
    assert len(v) == 5 and v.encode(["y", "x"], bos=True, eos=True) == [1, 4, 3, 2]
    assert v.decode([1, 4, 3, 2, 4, 0]) == ["y", "x"]
    assert torch.equal(pad_sequences([[3], [4, 5]]), torch.tensor([[3, 0], [4, 5]]))


def test_errors():
    with pytest.raises(ValueError, match="distinct"):
        Seq2SeqVocab(["a", "a"])
    with pytest.raises(ValueError, match="<pad>"):
        Seq2SeqVocab(["<pad>"])
    with pytest.raises(ValueError, match="not in the vocabulary"):
        Seq2SeqVocab(["a"]).encode(["b"])
    with pytest.raises(ValueError, match="min_len"):
        CopyTask(min_len=5, max_len=3)
    with pytest.raises(ValueError, match="n_symbols"):
        ReverseTask(n_symbols=27)
    with pytest.raises(ValueError, match="max_value"):
        NumberWordsTask(10**7)
    with pytest.raises(ValueError, match="first_year"):
        DateTask(2000, 1999)
    with pytest.raises(ValueError, match="split"):
        CopyTask().sample(4, split="valid")
    with pytest.raises(ValueError, match="n must be"):
        CopyTask().sample(0)
    with pytest.raises(ValueError, match="seqs"):
        pad_sequences([])
