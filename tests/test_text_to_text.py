"""Tests for companion.text_to_text: tokenizer, task pairs, play pairs, batching, exact match."""

import pytest
import torch

from companion.config import ModelConfig
from companion.generation import greedy_decode
from companion.models.t5 import T5
from companion.objectives import span_corrupt
from companion.tasks import MONTHS, DateTask, ReverseTask, SortTask
from companion.text_to_text import (
    EOS,
    PAD,
    TextToTextTokenizer,
    encode_pairs,
    exact_match,
    play_pairs,
    sentinel,
    task_pairs,
)
from companion.training import teacher_forcing_loss


@pytest.fixture
def tok():
    return TextToTextTokenizer("abcdefghijklmnopqrstuvwxyz0123456789- ", prefixes=["date", "sort", "sort descending"],
                               n_sentinels=12)


def test_special_ids_follow_t5(tok):
    assert (tok.pad_id, tok.eos_id, tok.unk_id) == (0, 1, 2)
    assert tok.itos[:3] == [PAD, EOS, "<unk>"]
    assert tok.sentinel_ids == list(range(3, 15))
    assert [tok.itos[i] for i in tok.sentinel_ids[:2]] == ["<extra_id_0>", "<extra_id_1>"]
    assert sentinel(7) == "<extra_id_7>"
    assert len(tok) == 3 + 12 + 3 + 38


def test_encode_specials_are_single_ids_and_round_trip(tok):
    text = "sort: ba<extra_id_10>c<extra_id_1>"
    ids = tok.encode(text)
    assert ids[0] == tok.prefix_id("sort")
    assert ids.count(tok.stoi["<extra_id_10>"]) == 1 and ids.count(tok.stoi["<extra_id_1>"]) == 1  # longest match
    assert tok.decode(ids, skip_special=False) == text
    # the longer prefix wins over its own beginning
    assert tok.encode("sort descending: a")[0] == tok.prefix_id("sort descending")
    assert tok.encode("ab", eos=True) == [tok.stoi["a"], tok.stoi["b"], tok.eos_id]


def test_a_prefix_is_one_token_wherever_it_appears(tok):
    # documented behaviour: "sort:" inside a passage is read as the prefix token, not as five characters
    ids = tok.encode("a sort: b")
    assert ids == [tok.stoi["a"], tok.stoi[" "], tok.prefix_id("sort"), tok.stoi[" "], tok.stoi["b"]]
    assert tok.encode("sort b") == [tok.stoi[c] for c in "sort b"]  # without the colon it is plain text


def test_unknown_characters_map_to_unk_and_decode_stops_at_eos(tok):
    assert tok.encode("A!") == [tok.unk_id, tok.unk_id]
    assert tok.decode([0, tok.stoi["a"], tok.eos_id, tok.stoi["b"]]) == "a"
    assert tok.decode(torch.tensor([tok.stoi["a"], tok.eos_id]), skip_special=False) == "a</s>"


def test_task_pairs_render_tasks_as_text():
    g = torch.Generator().manual_seed(0)
    (src, tgt), = task_pairs(DateTask(), 1, g)
    assert src.startswith("date: ") and len(src) == len("date: ") + 10
    day, month, year = tgt.split(" ")
    assert src[6:].split("-") == [year, f"{MONTHS.index(month) + 1:02d}", f"{int(day):02d}"]
    for s, t in task_pairs(ReverseTask(), 20, g):
        assert s.startswith("reverse: ") and t == s[len("reverse: "):][::-1]
    for s, t in task_pairs(SortTask(), 20, g, prefix=""):
        assert t == "".join(sorted(s))
    assert task_pairs(SortTask(), 3, torch.Generator().manual_seed(1), "test") == \
        task_pairs(SortTask(), 3, torch.Generator().manual_seed(1), "test")


def test_play_pairs():
    texts = ["abcdefghij" * 20, "0123456789" * 20]
    g = torch.Generator().manual_seed(0)
    for s, t in play_pairs(texts, ["x", "y"], 50, task="genre", window=12, generator=g):
        assert s.startswith("genre: ") and len(s) == len("genre: ") + 12
        assert t == ("x" if s[7] in "abcdefghij" else "y")
    for s, t in play_pairs(texts, ["x", "y"], 50, task="continue", window=12, target_len=5, generator=g):
        text = texts[0] if s[10] in "abcdefghij" else texts[1]
        passage = s[len("continue: "):]
        assert len(t) == 5 and (passage + t) in text


def test_encode_pairs_layout_and_truncation(tok):
    src, tgt = encode_pairs(tok, [("sort: cab", "abc"), ("sort: ba", "ab")])
    assert src.dtype == tgt.dtype == torch.long
    assert src[0].tolist() == tok.encode("sort: cab") + [1]
    assert src[1].tolist() == tok.encode("sort: ba") + [1, 0]
    assert tgt[0].tolist() == [0] + tok.encode("abc") + [1]
    assert tgt[1].tolist() == [0] + tok.encode("ab") + [1, 0]
    src, tgt = encode_pairs(tok, [("sort: cab", "abc")], max_source_len=4, max_target_len=3)
    assert src.shape[1] == 4 and src[0, -1] == 1 and tgt.tolist() == [[0, tok.stoi["a"], 1]]


def test_batches_train_and_decode_with_t5(tok):
    # the layout is the one teacher_forcing_loss and greedy_decode expect: the loss ignores padding
    torch.manual_seed(0)
    model = T5(ModelConfig.preset("t5-tiny", vocab_size=len(tok), d_model=32, d_ff=64))
    pairs = task_pairs(SortTask(4, 2, 4), 8, torch.Generator().manual_seed(0))
    src, tgt = encode_pairs(tok, pairs)
    loss = teacher_forcing_loss(model, (src, tgt))
    logits = model(src, tgt[:, :-1])
    real = tgt[:, 1:] != tok.pad_id
    manual = torch.nn.functional.cross_entropy(logits[real], tgt[:, 1:][real])
    torch.testing.assert_close(loss, manual)
    out = greedy_decode(model, src, tok.pad_id, tok.eos_id, max_len=6)
    truths = [t for _, t in pairs]
    assert exact_match(tok, out, truths) == sum(tok.decode(row) == t for row, t in zip(out, truths)) / len(pairs)
    assert exact_match(tok, tgt, truths) == 1.0  # the targets themselves match
    wrong = tgt.clone()
    wrong[:3, 1] = tok.stoi["z"]  # three rows changed (SortTask(4, 2, 4) writes only a-d): 5 of 8 still match
    assert exact_match(tok, wrong, truths) == 5 / 8


def test_span_corruption_with_the_tokenizer_sentinels(tok):
    ids = torch.tensor([tok.encode("the quick brown fox jumps over the lazy dog")])
    inputs, targets = span_corrupt(ids, sentinel_ids=tok.sentinel_ids, eos_id=tok.eos_id,
                                   generator=torch.Generator().manual_seed(0))
    text_in = tok.decode(inputs[0], skip_special=False)
    text_tgt = tok.decode(targets[0], skip_special=False)
    # putting each span back in place of its sentinel restores the text
    pieces = text_tgt.removesuffix(EOS).split("<extra_id_")[1:]
    restored = text_in.removesuffix(EOS)
    for piece in pieces:
        k, span = piece.split(">", 1)
        restored = restored.replace(f"<extra_id_{k}>", span)
    assert restored == "the quick brown fox jumps over the lazy dog"


@pytest.mark.parametrize("kwargs, match", [
    (dict(chars=""), "chars"),
    (dict(chars=["ab"]), "chars"),
    (dict(chars="ab", prefixes=["a:b"]), "prefixes"),
    (dict(chars="ab", prefixes=["x", "x"]), "prefixes"),
    (dict(chars="ab", n_sentinels=-1), "n_sentinels"),
])
def test_tokenizer_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TextToTextTokenizer(**kwargs)


def test_errors_name_the_argument(tok):
    with pytest.raises(TypeError, match="prefixes"):
        TextToTextTokenizer("ab", prefixes="sort")
    with pytest.raises(TypeError, match="text"):
        tok.encode(3)
    with pytest.raises(ValueError, match="ids"):
        tok.decode([len(tok)])
    with pytest.raises(ValueError, match="name"):
        tok.prefix_id("translate")
    with pytest.raises(TypeError, match="task"):
        task_pairs("sort", 3)
    with pytest.raises(TypeError, match="prefix"):
        task_pairs(SortTask(), 3, prefix=1)
    with pytest.raises(ValueError, match="task"):
        play_pairs(["a" * 100], ["x"], 2, task="speaker")
    with pytest.raises(ValueError, match="texts"):
        play_pairs(["a" * 100], ["x", "y"], 2)
    with pytest.raises(ValueError, match="window"):
        play_pairs(["a" * 20], ["x"], 2, window=16, target_len=8)
    with pytest.raises(TypeError, match="tokenizer"):
        encode_pairs(None, [("a", "b")])
    with pytest.raises(ValueError, match="pairs"):
        encode_pairs(tok, [])
    with pytest.raises(ValueError, match="max_target_len"):
        encode_pairs(tok, [("a", "b")], max_target_len=1)
    with pytest.raises(ValueError, match="targets"):
        exact_match(tok, torch.zeros(2, 3, dtype=torch.long), ["a"])
