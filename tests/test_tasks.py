import pytest
import torch

from companion.tasks import first_token_recall


def test_first_token_recall_layout():
    tokens, labels = first_token_recall(50, n_distractors=7, n_symbols=5, n_noise=3,
                                        generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (50, 9) and labels.shape == (50,)
    assert torch.equal(tokens[:, 0], labels)
    assert ((labels >= 0) & (labels < 5)).all()
    assert ((tokens[:, 1:-1] >= 5) & (tokens[:, 1:-1] < 8)).all()  # distractors never look like symbols
    assert (tokens[:, -1] == 8).all()  # query token
    assert len(set(labels.tolist())) == 5


def test_first_token_recall_is_seeded():
    a = first_token_recall(10, 4, generator=torch.Generator().manual_seed(1))
    b = first_token_recall(10, 4, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("kwargs, name", [({"n_samples": 0}, "n_samples"), ({"n_distractors": -1}, "n_distractors"),
                                          ({"n_symbols": 1}, "n_symbols"), ({"n_noise": 0}, "n_noise")])
def test_first_token_recall_bad_arguments(kwargs, name):
    args = {"n_samples": 4, "n_distractors": 3} | kwargs
    with pytest.raises(ValueError, match=name):
        first_token_recall(**args)


def _decode_retrieval(tokens, n_keys, n_values, n_filler):
    # The answer read back from the sequence: the value of the pair whose key the query names.
    n_pair_ids = n_keys * n_values
    key = tokens[:, -1] - n_pair_ids - n_filler
    is_pair = tokens[:, :-1] < n_pair_ids
    match = is_pair & (tokens[:, :-1] // n_values == key[:, None])
    return match, tokens[:, :-1] % n_values


def test_key_value_retrieval_layout_and_answer():
    from companion.tasks import key_value_retrieval, key_value_vocab_size

    distance = torch.tensor([1, 5, 30, 63, 17, 2])
    tokens, labels = key_value_retrieval(6, 64, distance, n_keys=6, n_values=5, n_pairs=4, n_filler=3,
                                         generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (6, 64) and labels.shape == (6,) and tokens.dtype == labels.dtype == torch.long
    assert int(tokens.min()) >= 0 and int(tokens.max()) < key_value_vocab_size(6, 5, 3)
    assert ((tokens[:, -1] >= 33) & (tokens[:, -1] < 39)).all()  # the last token is a query
    assert ((tokens[:, :-1] < 30).sum(dim=1) == 4).all()  # n_pairs pair tokens, the rest filler
    match, value = _decode_retrieval(tokens, 6, 5, 3)
    assert (match.sum(dim=1) == 1).all()  # exactly one pair has the queried key ...
    where = match.float().argmax(dim=1)
    assert torch.equal(63 - where, distance)  # ... exactly `distance` positions before the query
    assert torch.equal(value[torch.arange(6), where], labels)  # and it holds the label
    keys = torch.where(tokens[:, :-1] < 30, tokens[:, :-1] // 5, -1)
    assert all(len(set(row[row >= 0].tolist())) == 4 for row in keys)  # distinct keys per sequence


def test_key_value_retrieval_int_distance_seeded_and_uniform():
    from companion.tasks import key_value_retrieval

    a = key_value_retrieval(2000, 32, 7, generator=torch.Generator().manual_seed(3))
    b = key_value_retrieval(2000, 32, 7, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    tokens, labels = a
    match, _ = _decode_retrieval(tokens, 8, 8, 4)
    assert (match[:, 31 - 7]).all()
    counts = torch.bincount(labels, minlength=8).float()
    assert (counts / 2000 - 1 / 8).abs().max() < 0.03  # values uniform: chance is 1 / n_values


def test_key_value_retrieval_accepts_numpy_integer_distance():
    import numpy as np

    from companion.tasks import key_value_retrieval

    a = key_value_retrieval(8, 32, np.int64(5), generator=torch.Generator().manual_seed(1))
    b = key_value_retrieval(8, 32, 5, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    match, _ = _decode_retrieval(a[0], 8, 8, 4)
    assert match[:, 31 - 5].all()


@pytest.mark.parametrize("kwargs, name", [({"n_samples": 0}, "n_samples"), ({"seq_len": 1}, "seq_len"),
                                          ({"distance": 0}, "distance"), ({"distance": 16}, "distance"),
                                          ({"distance": 2.0}, "distance"), ({"distance": True}, "distance"),
                                          ({"distance": "3"}, "distance"),
                                          ({"distance": torch.tensor([1, 2])}, "distance"),
                                          ({"n_values": 1}, "n_values"), ({"n_pairs": 9}, "n_pairs"),
                                          ({"seq_len": 4}, "seq_len"), ({"n_filler": 0}, "n_filler")])
def test_key_value_retrieval_bad_arguments(kwargs, name):
    from companion.tasks import key_value_retrieval

    args = {"n_samples": 4, "seq_len": 16, "distance": 3} | kwargs
    with pytest.raises(ValueError, match=name):
        key_value_retrieval(**args)
