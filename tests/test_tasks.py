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
