"""Tests for companion.inference.pruning: magnitude masks vs torch.nn.utils.prune; structured pruning's identities."""

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from companion.config import ModelConfig
from companion.generation import generate
from companion.inference.pruning import (
    ffn_neuron_scores,
    head_scores,
    magnitude_masks,
    magnitude_prune,
    prune_ffn_neurons,
    prune_heads,
    sparsity_of,
)
from companion.models.gpt import GPT
from companion.utils import count_parameters

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _gpt(preset="tiny", seed=0, dtype=torch.float32, **kw) -> GPT:
    torch.manual_seed(seed)
    model = GPT(ModelConfig.preset(preset, **{"vocab_size": 64, "max_len": 32, **kw})).eval().to(dtype)
    with torch.no_grad():  # random biases (GPT-2 starts them at zero), so the bias terms are tested too
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.02)
    return model


IDS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
MODELS = {"gpt2": dict(preset="tiny"), "relu-no-bias": dict(preset="tiny", ffn="relu", bias=False),
          "llama-gqa": dict(preset="llama-tiny"), "llama-mha": dict(preset="llama-tiny", n_kv_heads=None),
          "geglu": dict(preset="tiny", ffn="geglu", position="rope")}


def _linears(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "head"]


# ------------------------------------------------------------------ unstructured: magnitude pruning


@pytest.mark.parametrize("sparsity", [0.3, 0.5, 0.9])
def test_global_masks_match_torch_prune(sparsity):
    model = _gpt()
    ref = copy.deepcopy(model)
    prune.global_unstructured([(m, "weight") for _, m in _linears(ref)], pruning_method=prune.L1Unstructured,
                              amount=sparsity)
    masks = magnitude_masks(model, sparsity)
    assert set(masks) == {n for n, _ in _linears(model)}
    for name, module in _linears(ref):
        assert torch.equal(masks[name], module.weight_mask.bool()), name


@pytest.mark.parametrize("sparsity", [0.25, 0.8])
def test_layer_masks_match_torch_prune(sparsity):
    model = _gpt("llama-tiny")
    masks = magnitude_masks(model, sparsity, scope="layer")
    for name, module in _linears(copy.deepcopy(model)):
        prune.l1_unstructured(module, "weight", amount=sparsity)
        assert torch.equal(masks[name], module.weight_mask.bool()), name


@pytest.mark.parametrize("scope", ["global", "layer"])
def test_magnitude_prune_zeroes_the_exact_fraction_of_smallest_weights(scope):
    model = _gpt()
    before = copy.deepcopy(model.state_dict())
    pruned = magnitude_prune(model, 0.37, scope=scope)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the original is unchanged
    groups = [[n] for n, _ in _linears(model)] if scope == "layer" else [[n for n, _ in _linears(model)]]
    zeroed = 0
    for names in groups:
        old = torch.cat([model.get_submodule(n).weight.flatten() for n in names])
        new = torch.cat([pruned.get_submodule(n).weight.flatten() for n in names])
        kept = new != 0
        assert int((~kept).sum()) == round(0.37 * old.numel())  # exactly (no zero weights before)
        zeroed += int((~kept).sum())
        assert torch.equal(new[kept], old[kept])  # kept weights untouched ...
        assert old[kept].abs().min() > old[~kept].abs().max()  # ... and they are exactly the largest |w|
    total = sum(m.weight.numel() for _, m in _linears(model))
    assert sparsity_of(pruned) == zeroed / total and abs(zeroed - 0.37 * total) <= len(groups) / 2
    assert sparsity_of(model) == 0
    for name, tensor in pruned.state_dict().items():  # biases, norms, embeddings and the head are untouched
        if not name.endswith("weight") or name in ("tok_emb.weight", "head.weight") or "norm" in name:
            assert torch.equal(tensor, before[name]), name


def test_ties_are_broken_to_the_exact_count():
    layer = nn.Linear(10, 10, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(100).reshape(10, 10) % 3 + 1.0)  # values 1, 2, 3: many ties
    for sparsity in (0.2, 0.5, 0.77):
        pruned = magnitude_prune(layer, sparsity)
        assert int((pruned.weight == 0).sum()) == round(sparsity * 100)
        assert sparsity_of(pruned) == round(sparsity * 100) / 100


def test_magnitude_pruning_is_idempotent_and_sparsity_zero_changes_nothing():
    model = _gpt("llama-tiny")
    for scope in ("global", "layer"):
        once = magnitude_prune(model, 0.6, scope=scope)
        for again in (magnitude_prune(once, 0.6, scope=scope), magnitude_prune(once, 0.3, scope=scope)):
            assert all(torch.equal(a, b) for a, b in zip(once.state_dict().values(), again.state_dict().values()))
    masks = magnitude_masks(model, 0)
    assert all(m.all() for m in masks.values())
    same = magnitude_prune(model, 0.0)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), same.state_dict().values()))
    assert torch.equal(same(IDS), model(IDS))


def test_a_tied_head_counts_once_when_not_skipped():
    model = _gpt()  # head.weight is tok_emb.weight
    masks = magnitude_masks(model, 0.5, skip=())
    assert "head" in masks
    pruned = magnitude_prune(model, 0.5, skip=())
    assert pruned.head.weight is pruned.tok_emb.weight  # still tied
    total = sum(m.weight.numel() for _, m in _linears(model)) + model.head.weight.numel()
    assert sparsity_of(pruned, skip=()) == round(0.5 * total) / total


def test_magnitude_pruning_rejects_bad_arguments():
    model = _gpt()
    for sparsity in (-0.1, 1.5, True, "0.5", float("nan")):
        with pytest.raises(ValueError, match="sparsity"):
            magnitude_prune(model, sparsity)
    with pytest.raises(ValueError, match="scope"):
        magnitude_prune(model, 0.5, scope="row")
    with pytest.raises(ValueError, match="skip"):
        magnitude_prune(model, 0.5, skip="head")
    with pytest.raises(ValueError, match="nn.Linear"):
        magnitude_prune(nn.Embedding(4, 4), 0.5)


# ------------------------------------------------------------------ structured: keeping everything, shapes, counts


@pytest.mark.parametrize("name", MODELS)
def test_keeping_every_neuron_and_head_gives_identical_logits(name):
    model = _gpt(**MODELS[name])
    c = model.config
    for pruned in (prune_ffn_neurons(model, 1.0), prune_ffn_neurons(model, c.resolved_d_ff),
                   prune_heads(model, c.n_heads), prune_heads(model, 1.0)):
        assert torch.equal(pruned(IDS), model(IDS))


def test_ffn_pruning_shrinks_the_matrices():
    model = _gpt()  # d_model 64, d_ff 256, biases
    pruned = prune_ffn_neurons(model, 100)
    assert pruned.config.d_ff == 100 and model.config.d_ff is None  # the original is unchanged
    for block in pruned.layers:
        assert block.ffn.w1.weight.shape == (100, 64) and block.ffn.w1.bias.shape == (100,)
        assert block.ffn.w2.weight.shape == (64, 100) and block.ffn.w2.bias.shape == (64,)
    assert count_parameters(pruned) == count_parameters(model) - 2 * 156 * (64 + 1 + 64)
    gated = _gpt("llama-tiny")  # d_ff 176, no biases, three matrices
    small = prune_ffn_neurons(gated, 0.5)
    assert small.config.d_ff == 88 and small.layers[1].ffn.w_gate.weight.shape == (88, 64)
    assert small.layers[1].ffn.w_out.weight.shape == (64, 88)
    assert count_parameters(small) == count_parameters(gated) - 2 * 88 * 3 * 64
    for m in (pruned, small):  # the config describes the pruned model: a fresh GPT loads its weights
        fresh = GPT(m.config).eval()
        fresh.load_state_dict(m.state_dict())
        assert torch.equal(fresh(IDS), m(IDS))


def test_head_pruning_shrinks_the_matrices():
    model = _gpt()  # 4 heads of 16, biases
    pruned = prune_heads(model, 3)
    c = pruned.config
    assert (c.n_heads, c.n_kv_heads, c.head_dim, c.resolved_n_kv_heads) == (3, None, 16, 3)
    attn = pruned.layers[0].self_attn
    assert attn.in_proj.weight.shape == (3 * 3 * 16, 64) and attn.out_proj.weight.shape == (64, 48)
    assert count_parameters(pruned) == count_parameters(model) - 2 * (3 * 16 * (64 + 1) + 16 * 64)
    gqa = _gpt("llama-tiny")  # 4 query heads, 2 key/value heads of 16, no biases
    small = prune_heads(gqa, 2)
    assert (small.config.n_heads, small.config.n_kv_heads) == (2, 1)
    attn = small.layers[1].self_attn
    assert attn.in_proj.weight.shape == ((2 + 2) * 16, 64) and attn.out_proj.weight.shape == (64, 32)
    assert count_parameters(small) == count_parameters(gqa) - 2 * (2 * 16 + 2 * 16) * 64 - 2 * 64 * 32
    assert small.make_cache(1, 8).keys.shape[2] == 1  # the cache follows the config: one key/value head
    for m in (pruned, small):
        fresh = GPT(m.config).eval()
        fresh.load_state_dict(m.state_dict())
        assert torch.equal(fresh(IDS), m(IDS))


def test_sliced_layers_match_hugging_face_prune_linear_layer():
    prune_linear_layer = pytest.importorskip("transformers.pytorch_utils").prune_linear_layer
    model = _gpt()
    scores = torch.tensor([[3.0, 0.0, 2.0, 1.0], [0.0, 1.0, 3.0, 2.0]])  # drop head 1, then head 0
    pruned = prune_heads(model, 3, scores=scores)
    for block, old, dropped in zip(pruned.layers, model.layers, (1, 0)):
        heads = [h for h in range(4) if h != dropped]
        q = torch.cat([torch.arange(h * 16, h * 16 + 16) for h in heads])
        rows = torch.cat([q, 64 + q, 128 + q])
        ref_in = prune_linear_layer(old.self_attn.in_proj, rows, dim=0)
        ref_out = prune_linear_layer(old.self_attn.out_proj, q, dim=1)
        for ours, ref in ((block.self_attn.in_proj, ref_in), (block.self_attn.out_proj, ref_out)):
            assert torch.equal(ours.weight, ref.weight) and torch.equal(ours.bias, ref.bias)


# ------------------------------------------------------------------ structured: the right units go


def _zero_ffn(model, neurons, side):
    with torch.no_grad():
        for block, js in zip(model.layers, neurons):
            ffn = block.ffn
            if side == "out":
                (ffn.w2 if hasattr(ffn, "w2") else ffn.w_out).weight[:, js] = 0
            else:  # the input side, with its bias: the neuron's pre-activation is 0 and act(0) = 0
                for lin in (ffn.w1,) if hasattr(ffn, "w1") else (ffn.w_in,):
                    lin.weight[js] = 0
                    if lin.bias is not None:
                        lin.bias[js] = 0


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa", "geglu"])
@pytest.mark.parametrize("side", ["in", "out"])
def test_pruning_neurons_that_write_nothing_changes_no_logit(name, side):
    model = _gpt(dtype=torch.float64, **MODELS[name])
    d_ff = model.config.resolved_d_ff
    neurons = [[3, 50, d_ff - 1], [0, 7, 100]]  # different in each layer
    _zero_ffn(model, neurons, side)
    assert (ffn_neuron_scores(model)[0, neurons[0]] == 0).all()
    pruned = prune_ffn_neurons(model, d_ff - 3)
    torch.testing.assert_close(pruned(IDS), model(IDS), rtol=0, atol=1e-12)
    kept = [j for j in range(d_ff) if j not in neurons[1]]
    ffn, old = pruned.layers[1].ffn, model.layers[1].ffn
    first, last = ("w1", "w2") if hasattr(ffn, "w1") else ("w_in", "w_out")
    assert torch.equal(getattr(ffn, first).weight, getattr(old, first).weight[kept])
    assert torch.equal(getattr(ffn, last).weight, getattr(old, last).weight[:, kept])
    # removing live neurons instead does change the logits: the identity above is not vacuous
    wrong = prune_ffn_neurons(model, d_ff - 3, scores=-ffn_neuron_scores(model))
    assert (wrong(IDS) - model(IDS)).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa"])
def test_pruning_neurons_equals_masking_them(name):
    model = _gpt(dtype=torch.float64, **MODELS[name])
    d_ff = model.config.resolved_d_ff
    scores = torch.rand(2, d_ff, generator=torch.Generator().manual_seed(2))  # an arbitrary choice
    pruned = prune_ffn_neurons(model, 0.7, scores=scores)
    keep = pruned.config.d_ff
    masked = copy.deepcopy(model)
    _zero_ffn(masked, [s.topk(d_ff - keep, largest=False).indices for s in scores], "out")
    torch.testing.assert_close(pruned(IDS), masked(IDS), rtol=0, atol=1e-12)
    assert (pruned(IDS) - model(IDS)).abs().max() > 1e-4


def test_a_unit_with_zero_weights_but_a_bias_still_scores():
    model = _gpt()  # biases: a neuron (a head) with no input (value) weights still writes act(b) W_2[:, j] (b_V W^O_h)
    with torch.no_grad():
        model.layers[0].ffn.w1.weight[5] = 0
        model.layers[0].self_attn.in_proj.weight[128 + 32:128 + 48] = 0  # head 2's value rows
    assert ffn_neuron_scores(model)[0, 5] > 0 and head_scores(model)[0, 2] > 0
    assert ffn_neuron_scores(model).shape == (2, 256) and head_scores(model).shape == (2, 4)


def _zero_heads(model, heads, side="out"):
    with torch.no_grad():
        for block, hs in zip(model.layers, heads):
            attn, d = block.self_attn, block.self_attn.head_dim
            for h in hs:
                if side == "out":
                    attn.out_proj.weight[:, h * d:(h + 1) * d] = 0
                else:  # the head's value rows (and bias): its output is a mix of zero vectors
                    g = h // (attn.n_heads // attn.n_kv_heads)
                    start = (attn.n_heads + attn.n_kv_heads + g) * d
                    attn.in_proj.weight[start:start + d] = 0
                    if attn.in_proj.bias is not None:
                        attn.in_proj.bias[start:start + d] = 0


@pytest.mark.parametrize("name, heads, keep", [("gpt2", [[1], [3]], 3), ("gpt2", [[0, 2], [1, 3]], 2),
                                               ("llama-gqa", [[0, 1], [2, 3]], 2), ("llama-mha", [[2], [0]], 3)])
@pytest.mark.parametrize("side", ["in", "out"])
def test_pruning_heads_that_write_nothing_changes_no_logit(name, heads, keep, side):
    model = _gpt(dtype=torch.float64, **MODELS[name])
    _zero_heads(model, heads, side)
    assert (head_scores(model)[1, heads[1]] == 0).all()
    pruned = prune_heads(model, keep)
    torch.testing.assert_close(pruned(IDS), model(IDS), rtol=0, atol=1e-12)
    wrong = prune_heads(model, keep, scores=-head_scores(model))
    assert (wrong(IDS) - model(IDS)).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa"])
def test_pruning_heads_equals_masking_them(name):
    model = _gpt(dtype=torch.float64, **MODELS[name])
    scores = torch.tensor([[0.5, 0.9, 0.1, 0.7], [0.1, 0.2, 0.3, 0.6]])
    pruned = prune_heads(model, 2, scores=scores)
    gone = [[0, 2], [0, 1]] if name == "gpt2" else [[2, 3], [0, 1]]  # GQA: groups scored 1.4, 0.8 and 0.3, 0.9
    masked = copy.deepcopy(model)
    _zero_heads(masked, gone)
    torch.testing.assert_close(pruned(IDS), masked(IDS), rtol=0, atol=1e-12)
    assert (pruned(IDS) - model(IDS)).abs().max() > 1e-4


# ------------------------------------------------------------------ the pruned model is an ordinary GPT


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa"])
def test_a_pruned_model_trains_and_generates(name):
    model = _gpt(**MODELS[name])
    pruned = prune_heads(prune_ffn_neurons(model, 0.5), 0.5).train()
    before = pruned.layers[0].ffn.state_dict()["w_out.weight" if name != "gpt2" else "w2.weight"].clone()
    optimizer = torch.optim.AdamW(pruned.parameters(), lr=1e-2)
    loss = pruned.loss(IDS[:, :-1], IDS[:, 1:])
    loss.backward()
    optimizer.step()
    after = pruned.layers[0].ffn.state_dict()["w_out.weight" if name != "gpt2" else "w2.weight"]
    assert torch.isfinite(loss) and not torch.equal(before, after)
    assert pruned.loss(IDS[:, :-1], IDS[:, 1:]) < loss  # one step on the same batch lowers its loss
    pruned.eval()
    cached = generate(pruned, IDS[:, :6], 8, temperature=0)
    assert cached.shape == (2, 14) and torch.equal(cached, generate(pruned, IDS[:, :6], 8, temperature=0,
                                                                     use_cache=False))


def test_structured_pruning_rejects_bad_arguments():
    model = _gpt()
    for keep in (0, 257, 0.0, 1.5, True, "half", None):
        with pytest.raises(ValueError, match="keep"):
            prune_ffn_neurons(model, keep)
    for keep in (0, 5, -1, 0.0):
        with pytest.raises(ValueError, match="keep_heads"):
            prune_heads(model, keep)
    assert prune_ffn_neurons(model, 0.001).config.d_ff == 1 and prune_heads(model, 0.1).config.n_heads == 1
    with pytest.raises(ValueError, match="scores"):
        prune_ffn_neurons(model, 10, scores=torch.ones(2, 255))
    with pytest.raises(ValueError, match="scores"):
        prune_heads(model, 2, scores=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="multiple of n_heads / n_kv_heads = 2"):
        prune_heads(_gpt("llama-tiny"), 3)
    with pytest.raises(ValueError, match="position='alibi'"):
        prune_heads(_gpt(position="alibi"), 2)
    with pytest.raises(TypeError, match="companion GPT"):
        prune_ffn_neurons(nn.Linear(4, 4), 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pruning_on_cuda_matches_cpu():
    model = _gpt("llama-tiny")
    gpu = copy.deepcopy(model).cuda()
    masks, gpu_masks = magnitude_masks(model, 0.5), magnitude_masks(gpu, 0.5)
    assert all(gpu_masks[n].is_cuda and torch.equal(gpu_masks[n].cpu(), m) for n, m in masks.items())
    for prune_fn in (lambda m: prune_ffn_neurons(m, 0.5), lambda m: prune_heads(m, 2)):
        cpu_model, gpu_model = prune_fn(model), prune_fn(gpu)
        assert all(p.is_cuda for p in gpu_model.parameters())
        torch.testing.assert_close(gpu_model(IDS.cuda()).cpu(), cpu_model(IDS), rtol=1e-4, atol=1e-4)
