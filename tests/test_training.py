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


def test_evaluation_can_use_another_loss():
    seed_everything(0)
    model = nn.Linear(5, 3)
    held_out = [make_problem()(0)]
    double = lambda m, b: 2 * cross_entropy_loss(m, b)  # noqa: E731
    history = train(model, make_problem(), steps=3, loss_fn=double, eval_loss_fn=cross_entropy_loss,
                    eval_batches=held_out, progress=False)
    assert history.eval_loss[-1] == pytest.approx(evaluate(model, held_out))


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


# ------------------------------------------------------------------ the recipe's parts


def test_noam_is_the_papers_formula_and_peaks_at_warmup():
    from companion.training import noam

    rate = noam(512, 4000)
    assert rate(1) == pytest.approx(512**-0.5 * 4000**-1.5)  # linear warm-up from step 1
    assert rate(4000) == pytest.approx(512**-0.5 * 4000**-0.5)  # the peak, ~7.0e-4
    assert rate(16000) == pytest.approx(rate(4000) / 2)  # then 1/sqrt(step)
    assert max(range(1, 20000, 7), key=rate) in range(3994, 4007)
    with pytest.raises(ValueError, match="noam counts steps from 1"):
        rate(0)
    with pytest.raises(ValueError, match="warmup must be an int >= 1"):
        noam(512, 0)


def test_warmup_linear_schedule():
    from companion.training import warmup_linear_schedule

    s = warmup_linear_schedule(2, 6)
    assert [s(i) for i in range(6)] == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])
    with pytest.raises(ValueError, match=r"min_ratio must be a number in \[0, 1\]"):
        warmup_linear_schedule(1, 2, min_ratio=2)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_label_smoothing_equals_pytorch_and_its_formula(smoothing):
    from companion.training import label_smoothed_cross_entropy

    logits, targets = torch.randn(4, 6, 9), torch.randint(0, 9, (4, 6))
    targets[0, :2] = -100
    expected = nn.functional.cross_entropy(logits.reshape(-1, 9), targets.reshape(-1), label_smoothing=smoothing)
    torch.testing.assert_close(label_smoothed_cross_entropy(logits, targets, smoothing), expected)
    # (1 - e) * NLL + e * mean over classes of -log p: the second term is what keeps the model unsure
    keep = targets != -100
    log_p = logits.log_softmax(-1)[keep]
    nll = -log_p.gather(-1, targets[keep][:, None]).mean()
    torch.testing.assert_close(label_smoothed_cross_entropy(logits, targets, smoothing),
                               (1 - smoothing) * nll + smoothing * (-log_p.mean()))
    with pytest.raises(ValueError, match=r"smoothing must be a number in \[0, 1\)"):
        label_smoothed_cross_entropy(logits, targets, 1.0)
    with pytest.raises(ValueError, match=r"targets must have shape \(4, 6\)"):
        label_smoothed_cross_entropy(logits, targets[:, :3])


def test_weight_decay_spares_biases_norms_and_embeddings():
    from companion.config import ModelConfig
    from companion.models.gpt import GPT
    from companion.training import adamw, param_groups

    model = GPT(ModelConfig.preset("tiny", vocab_size=20))
    decay, rest = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("weight") and p.dim() == 2 for p in decay["params"])
    assert not any("emb" in names[id(p)] or "norm" in names[id(p)] for p in decay["params"])
    assert {names[id(p)] for p in rest["params"]} >= {"tok_emb.weight", "stack.positions.table.weight",
                                                      "stack.norm.weight", "stack.norm.bias"}
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))  # tied head counted once
    # decoupled decay: with a zero gradient AdamW shrinks exactly the decayed weights, by lr * wd
    opt = adamw(model, lr=0.1, weight_decay=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    decayed = {id(p) for p in decay["params"]}
    for n, p in model.named_parameters():
        factor = 1 - 0.1 * 0.5 if id(p) in decayed else 1.0
        torch.testing.assert_close(p.detach(), before[n] * factor)


def _linear_run(accumulation_steps, steps=3, micro=8):
    """A linear model on fixed data; micro-batch i is rows [i*micro, (i+1)*micro) of a fixed table."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 5, generator=g), torch.randint(0, 3, (64,), generator=g)
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    rows = micro * 4 // accumulation_steps  # 4 * micro rows per optimizer step, either way

    def batch(i):
        return x[i * rows % 64 : i * rows % 64 + rows], y[i * rows % 64 : i * rows % 64 + rows]

    history = train(model, batch, steps, accumulation_steps=accumulation_steps, lr=0.1, progress=False)
    return model, history


def test_accumulation_equals_one_step_on_the_concatenation():
    big, h_big = _linear_run(1)
    small, h_small = _linear_run(4)
    for a, b in zip(big.parameters(), small.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert h_small.train_loss == pytest.approx(h_big.train_loss, abs=1e-6)


def test_batch_fn_sees_running_micro_batch_indices_and_start_step():
    seen = []

    def batch(i):
        seen.append(i)
        return torch.randn(2, 5), torch.randint(0, 3, (2,))

    train(nn.Linear(5, 3), batch, steps=2, accumulation_steps=3, start_step=4, progress=False)
    assert seen == [12, 13, 14, 15, 16, 17]


def test_bf16_on_cpu_trains_and_fp16_needs_cuda():
    seed_everything(0)
    model = nn.Linear(5, 3)
    history = train(model, make_problem(), steps=60, lr=3e-2, precision="bf16", device="cpu", progress=False)
    assert history.train_loss[-1] < 0.5 * history.train_loss[0]
    assert model.weight.dtype == torch.float32  # the weights stay float32; only the forward runs in bf16
    with pytest.raises(ValueError, match="precision='fp16' needs a CUDA device"):
        train(model, make_problem(), steps=1, precision="fp16", device="cpu", progress=False)
    with pytest.raises(ValueError, match="precision must be one of"):
        train(model, make_problem(), steps=1, precision="fp8", progress=False)


# ------------------------------------------------------------------ checkpoints


def _dropout_lm():
    from companion.config import ModelConfig
    from companion.models.gpt import GPT

    return GPT(ModelConfig.preset("tiny", vocab_size=17, max_len=16, dropout=0.2))


def _resumable_run(tmp_path, stop_at=None, steps=6):
    """Train a GPT with dropout on random batches; optionally stop, checkpoint, rebuild and resume."""
    from companion.training import adamw, load_checkpoint, save_checkpoint
    from companion.training.losses import cross_entropy_loss

    seed_everything(0)
    model = _dropout_lm()
    opt = adamw(model, lr=1e-2)
    data = torch.Generator().manual_seed(1)

    def batch(i):
        ids = torch.randint(0, 17, (4, 9), generator=data)
        return ids[:, :-1], ids[:, 1:]

    if stop_at is None:
        train(model, batch, steps, optimizer=opt, loss_fn=cross_entropy_loss, device="cpu", progress=False)
        return model
    train(model, batch, stop_at, optimizer=opt, device="cpu", progress=False)
    path = save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=opt, step=stop_at,
                           generators={"data": data})
    seed_everything(123)  # a fresh process: everything random is different
    model, data = _dropout_lm(), torch.Generator().manual_seed(99)
    opt = adamw(model, lr=1e-2)
    state = load_checkpoint(path, model=model, optimizer=opt, generators={"data": data})
    train(model, batch, steps - state["step"], optimizer=opt, start_step=state["step"], device="cpu",
          progress=False)
    return model


def test_stopping_and_resuming_gives_bitwise_the_same_weights(tmp_path):
    straight = _resumable_run(tmp_path)
    resumed = _resumable_run(tmp_path, stop_at=2)
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), name


def test_checkpoints_are_written_atomically_and_corruption_is_reported(tmp_path, monkeypatch):
    from companion.training import load_checkpoint, save_checkpoint

    model = nn.Linear(3, 2)
    path = save_checkpoint(tmp_path / "c.pt", model=model, step=1, extra={"note": "first"})
    assert load_checkpoint(path, model=model)["extra"] == {"note": "first"}

    def crash(obj, f):  # the disk fills up half-way through the next save
        f.write(b"partial")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, model=model, step=2)
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1  # the previous checkpoint survived
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]  # no temporary file left behind

    truncated = tmp_path / "t.pt"
    truncated.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(truncated)
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="is not a companion-checkpoint-v1 checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(ValueError, match="holds no optimizer state"):
        load_checkpoint(path, optimizer=torch.optim.SGD(model.parameters(), lr=1))


def _trained_optimizer(tmp_path):
    """A Linear trained 3 steps and its checkpoint (model + AdamW state)."""
    from companion.training import adamw, save_checkpoint

    seed_everything(0)
    model = nn.Linear(5, 3)
    opt = adamw(model, lr=1e-2)
    train(model, make_problem(), steps=3, optimizer=opt, device="cpu", progress=False)
    return save_checkpoint(tmp_path / "c.pt", model=model, optimizer=opt, step=3)


def test_optimizer_state_follows_its_parameters_device(tmp_path):
    """The root of "Expected all tensors to be on the same device" after resuming on another
    device: load_state_dict puts the state where the parameters are then, and a model moved
    afterwards leaves it behind. optimizer_to_params moves it; the meta device stands in for a
    GPU (CPU tensors can be moved to it), and the step counter stays on the CPU as in PyTorch."""
    from companion.training import adamw, optimizer_to_params, read_checkpoint

    saved = read_checkpoint(_trained_optimizer(tmp_path))["optimizer"]["state"]
    with torch.device("meta"):
        model = nn.Linear(5, 3)
    opt = adamw(model, lr=1e-2)
    params = [p for g in opt.param_groups for p in g["params"]]
    for index, p in enumerate(params):  # CPU state for parameters that live elsewhere
        opt.state[p] = {k: v.clone() for k, v in saved[index].items()}
    assert all(s["exp_avg"].device.type == "cpu" for s in opt.state.values())
    assert optimizer_to_params(opt) is opt
    for p in params:
        state = opt.state[p]
        assert state["exp_avg"].device.type == state["exp_avg_sq"].device.type == "meta"
        assert state["exp_avg"].shape == p.shape
        assert state["step"].device.type == "cpu" and state["step"].item() == 3


def test_a_restored_optimizer_resumes_where_the_model_trains(tmp_path):
    """Restore, then train with the restored optimizer: its step counters go on from 3 to 5."""
    from companion.training import adamw, load_checkpoint

    path = _trained_optimizer(tmp_path)
    model = nn.Linear(5, 3)
    opt = adamw(model, lr=1e-2)
    load_checkpoint(path, model=model, optimizer=opt, restore_rng=False)
    history = train(model, make_problem(), steps=2, optimizer=opt, device="cpu", progress=False)
    assert all(math.isfinite(x) for x in history.train_loss)
    assert all(s["step"].item() == 5 for s in opt.state.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_resuming_a_cpu_checkpoint_on_cuda_trains(tmp_path):
    """The 13b failure: restore on the CPU, then train on CUDA with the restored optimizer."""
    from companion.training import adamw, load_checkpoint

    path = _trained_optimizer(tmp_path)
    model = nn.Linear(5, 3)
    opt = adamw(model, lr=1e-2)
    load_checkpoint(path, model=model, optimizer=opt, restore_rng=False)
    history = train(model, make_problem(), steps=2, optimizer=opt, device="cuda", progress=False)
    assert all(math.isfinite(x) for x in history.train_loss)
    assert all(s["exp_avg"].is_cuda for s in opt.state.values())


def test_the_mps_generator_is_saved_and_restored(monkeypatch):
    """On Apple silicon, dropout draws from the MPS generator: a resumed run must restore it too.
    Simulated here (no MPS on this machine): the state goes through rng_states and back."""
    from companion.training import checkpoint

    saved = {"state": torch.tensor([1, 2, 3], dtype=torch.uint8)}
    monkeypatch.setattr(checkpoint, "_mps_available", lambda: True)
    monkeypatch.setattr(torch.mps, "get_rng_state", lambda: saved["state"].clone())
    monkeypatch.setattr(torch.mps, "set_rng_state", lambda state: saved.update(state=state.clone()))
    states = checkpoint.rng_states()
    assert torch.equal(states["mps"], torch.tensor([1, 2, 3], dtype=torch.uint8))
    saved["state"] = torch.tensor([9, 9, 9], dtype=torch.uint8)  # the generator moves on
    checkpoint.set_rng_states(states)
    assert torch.equal(saved["state"], torch.tensor([1, 2, 3], dtype=torch.uint8))
