import math

import pytest
import torch
from torch import nn

from companion.training import TrainHistory, cross_entropy_loss, evaluate, train, warmup_cosine_schedule
from companion.utils import get_device, seed_everything


def make_problem(seed=0):
    """A linearly separable 3-class problem a linear model solves."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(5, 3, generator=g)

    def batch(step):
        x = torch.randn(64, 5, generator=g)
        return x, (x @ w).argmax(-1)

    return batch


def test_train_reduces_the_loss_and_records_history():
    seed_everything(0)
    model = nn.Linear(5, 3)
    batch = make_problem()
    held_out = [batch(0) for _ in range(4)]
    before = evaluate(model, held_out)
    history = train(model, batch, steps=150, lr=3e-2, eval_batches=held_out, eval_every=50, progress=False)
    assert isinstance(history, TrainHistory)
    assert len(history.train_loss) == len(history.lr) == len(history.grad_norm) == 150
    assert history.eval_steps == [50, 100, 150]
    assert history.eval_loss[-1] < 0.5 * before
    assert history.eval_loss[-1] == pytest.approx(evaluate(model, held_out))


def test_train_is_deterministic_given_seeds():
    results = []
    for _ in range(2):
        seed_everything(3)
        model = nn.Linear(5, 3)
        results.append(train(model, make_problem(1), steps=20, progress=False).train_loss)
    assert results[0] == results[1]


def test_gradient_clipping_bounds_the_update():
    seed_everything(0)
    model = nn.Linear(5, 3)
    big = lambda step: (1e4 * torch.randn(8, 5), torch.randint(0, 3, (8,)))  # noqa: E731
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    history = train(model, big, steps=1, optimizer=optimizer, grad_clip=0.5, progress=False)
    step_norm = math.sqrt(sum(((p - b) ** 2).sum().item() for p, b in zip(model.parameters(), before)))
    assert history.grad_norm[0] > 0.5  # the unclipped norm is what is recorded
    assert step_norm == pytest.approx(0.5, rel=1e-4)  # SGD with lr 1 moves by exactly the clipped norm


def test_lr_schedule_is_applied():
    model = nn.Linear(5, 3)
    schedule = warmup_cosine_schedule(warmup_steps=4, total_steps=10, min_ratio=0.1)
    history = train(model, make_problem(), steps=10, lr=1.0, lr_schedule=schedule, progress=False)
    assert history.lr[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert history.lr[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 5 / 6)))
    assert all(a >= b for a, b in zip(history.lr[3:], history.lr[4:]))


def test_train_runs_on_the_default_device():
    model = nn.Linear(5, 3)
    train(model, make_problem(), steps=2, progress=False)
    assert next(model.parameters()).device.type == get_device().type


def test_cross_entropy_loss_flattens_sequences():
    logits_model = nn.Embedding(7, 7)
    tokens = torch.randint(0, 7, (2, 5))
    loss = cross_entropy_loss(logits_model, (tokens, tokens))
    expected = nn.functional.cross_entropy(logits_model(tokens).view(-1, 7), tokens.view(-1))
    torch.testing.assert_close(loss, expected)


def test_bad_arguments():
    model = nn.Linear(5, 3)
    with pytest.raises(ValueError, match="steps"):
        train(model, make_problem(), steps=0, progress=False)
    with pytest.raises(ValueError, match="eval_every"):
        train(model, make_problem(), steps=2, eval_every=1, progress=False)
    with pytest.raises(ValueError, match="warmup_steps"):
        warmup_cosine_schedule(warmup_steps=20, total_steps=10)
    with pytest.raises(ValueError, match="batches"):
        evaluate(model, [])
    nan_batch = lambda step: (torch.full((4, 5), float("nan")), torch.zeros(4, dtype=torch.long))  # noqa: E731
    with pytest.raises(FloatingPointError, match="step 0"):
        train(model, nan_batch, steps=1, progress=False)


def test_schedule_restarts_from_the_initial_rate_when_the_optimizer_is_reused():
    model = nn.Linear(5, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    schedule = warmup_cosine_schedule(warmup_steps=0, total_steps=4, min_ratio=0.0)
    first = train(model, make_problem(), steps=4, optimizer=optimizer, lr_schedule=schedule, progress=False)
    second = train(model, make_problem(), steps=4, optimizer=optimizer, lr_schedule=schedule, progress=False)
    assert first.lr[0] == pytest.approx(0.1) and second.lr == pytest.approx(first.lr)
