import pytest
import torch

from companion import data


@pytest.fixture(scope="module")
def corpus():
    return data.shakespeare_corpus()


def test_corpus_has_every_play_with_title_genre_and_text(corpus):
    assert corpus.column_names == ["title", "genre", "text"]
    assert len(corpus) == 38
    assert set(corpus["genre"]) == set(data.GENRES)
    titles = set(corpus["title"])
    assert {"Hamlet", "Macbeth", "The Tempest", "Twelfth Night", "Henry V"} <= titles
    assert len(titles) == 38  # one row per play
    hamlet = corpus[corpus["title"].index("Hamlet")]
    assert hamlet["genre"] == "tragedy"
    assert "To be, or not to be" in hamlet["text"]


def test_corpus_size_matches_the_files(corpus):
    raw = sum(len(p.read_text(encoding="utf-8")) for p in data.shakespeare_files())
    cleaned = sum(len(t) for t in corpus["text"])
    assert 5_000_000 < raw < 5_600_000
    assert 0.85 * raw < cleaned < raw  # markup removed, words kept


def test_cleaning_removes_markdown_and_keeps_speakers(corpus):
    text = corpus[corpus["title"].index("Twelfth Night")]["text"]
    assert "**" not in text and "\\[" not in text and "  \n" not in text
    assert "DUKE ORSINO:\nIf music be the food of love, play on;\n" in text
    raw = data.shakespeare_corpus(genre="comedy", clean=False)
    assert "**DUKE ORSINO**" in raw[raw["title"].index("Twelfth Night")]["text"]


def test_genre_filter(corpus):
    tragedies = data.shakespeare_corpus(genre="tragedy")
    assert set(tragedies["genre"]) == {"tragedy"}
    assert sorted(tragedies["title"]) == sorted(t for t, g in zip(corpus["title"], corpus["genre"]) if g == "tragedy")
    both = data.shakespeare_corpus(genre=["tragedy", "roman"])
    assert set(both["genre"]) == {"tragedy", "roman"}


@pytest.mark.parametrize("bad", ["sonnet", ["comedy", "epic"], []])
def test_unknown_genre_raises_naming_the_argument(bad):
    with pytest.raises(ValueError, match="genre"):
        data.shakespeare_corpus(genre=bad)


def test_split_is_deterministic_whole_plays_and_disjoint(corpus):
    first = data.train_val_split(corpus, val_fraction=0.1, seed=0)
    again = data.train_val_split(corpus, val_fraction=0.1, seed=0)
    other = data.train_val_split(corpus, val_fraction=0.1, seed=1)
    assert first["validation"]["title"] == again["validation"]["title"]
    assert set(first["validation"]["title"]) != set(other["validation"]["title"])
    assert len(first["validation"]) == 4 and len(first["train"]) == 34
    assert not set(first["train"]["title"]) & set(first["validation"]["title"])


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 0.999])
def test_split_rejects_fractions_that_leave_an_empty_split(corpus, bad):
    with pytest.raises(ValueError, match="val_fraction"):
        data.train_val_split(corpus, val_fraction=bad)


def test_shakespeare_text_joins_the_split(corpus):
    validation = data.shakespeare_text("validation")
    titles = data.train_val_split(corpus)["validation"]["title"]
    assert all(title in validation for title in titles)
    with pytest.raises(ValueError, match="split"):
        data.shakespeare_text("test")


def test_char_vocab_round_trip_and_errors():
    vocab = data.CharVocab.from_text("to be or not to be")
    assert vocab.itos == sorted(set("to be or not to be"))
    ids = vocab.encode("not to be")
    assert ids.dtype == torch.long and ids.shape == (9,)
    assert vocab.decode(ids) == "not to be"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vocab.encode("Xyz")
    with pytest.raises(ValueError, match="ids must be in"):
        vocab.decode([0, len(vocab)])
    with pytest.raises(ValueError, match="text"):
        data.CharVocab.from_text("")
    with pytest.raises(ValueError, match="distinct"):
        data.CharVocab(["a", "a"])


def test_lm_batch_windows_are_shifted_copies_of_the_stream():
    ids = torch.arange(100)
    x, y = data.lm_batch(ids, batch_size=8, block_size=16, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 16)
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y, x + 1)  # the stream is 0, 1, 2, ...: each window is contiguous
    assert int(y.max()) <= 99
    with pytest.raises(ValueError, match="block_size"):
        data.lm_batch(ids[:10], batch_size=2, block_size=10)
    with pytest.raises(ValueError, match="1-D"):
        data.lm_batch(ids.view(10, 10), batch_size=2, block_size=4)
