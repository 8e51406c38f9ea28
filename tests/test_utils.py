import random

import numpy as np
import pytest
import torch
from torch import nn

from companion.utils import count_parameters, get_device, seed_everything


def test_seed_everything_makes_every_generator_repeat():
    def draw():
        return random.random(), np.random.rand(), torch.rand(3), torch.rand(2, generator=gen)

    gen = seed_everything(123)
    first = draw()
    gen = seed_everything(123)
    second = draw()
    assert first[:2] == second[:2]
    assert torch.equal(first[2], second[2]) and torch.equal(first[3], second[3])
    seed_everything(124)
    assert not torch.equal(torch.rand(3), first[2])


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True, None])
def test_seed_everything_rejects_bad_seeds(bad):
    with pytest.raises(ValueError, match="seed"):
        seed_everything(bad)


def test_get_device_default_follows_availability_order():
    device = get_device()
    if torch.cuda.is_available():
        assert device.type == "cuda"
    elif torch.backends.mps.is_available():
        assert device.type == "mps"
    else:
        assert device == torch.device("cpu")


def test_get_device_explicit_choices():
    assert get_device("cpu") == torch.device("cpu")
    assert get_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_get_device_unavailable_cuda_raises_clearly():
    with pytest.raises(RuntimeError, match="'cuda'.*not available"):
        get_device("cuda")


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="needs a machine without MPS")
def test_get_device_unavailable_mps_raises_clearly():
    with pytest.raises(RuntimeError, match="'mps'.*not available"):
        get_device("mps")


@pytest.mark.parametrize("bad", ["gpu", "tpu", 3.5])
def test_get_device_rejects_unknown_names(bad):
    with pytest.raises(ValueError, match="prefer"):
        get_device(bad)


def test_count_parameters_counts_trainable_and_shared_once():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))  # 3*4+4 + 4*2+2 = 26
    assert count_parameters(model) == 26
    model[1].weight.requires_grad_(False)
    assert count_parameters(model) == 18
    assert count_parameters(model, trainable_only=False) == 26
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied
    assert count_parameters(nn.ModuleList([emb, head])) == 40


def test_count_parameters_rejects_non_modules():
    with pytest.raises(TypeError, match="module"):
        count_parameters(torch.zeros(3))
