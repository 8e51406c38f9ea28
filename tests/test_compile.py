"""``torch.compile``: no graph breaks, a static KV cache that equals the dynamic one, compiled == eager.

A graph break splits a compiled model into pieces with Python between them, and usually means a
host sync (a tensor read on the CPU) on every call. ``torch._dynamo.explain`` traces without
compiling, so these checks are cheap; the one test that really compiles (inductor, on the CPU)
decodes with :class:`~companion.fast_generation.CompiledGenerator` and compares the tokens with
eager decoding.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from companion.attention import KVCache, MultiHeadAttention, StaticKVCache
from companion.config import ModelConfig
from companion.fast_generation import CompiledGenerator
from companion.flops import PEAK_BF16_FLOPS, flops_per_token, mfu, peak_flops
from companion.generation import generate
from companion.models.bert import BERT
from companion.models.gpt import GPT
from companion.models.t5 import T5

torch._logging.set_logs(dynamo=logging.ERROR)  # explain() reports the breaks; no warnings in the log

LLAMA = dict(position="rope", norm="rmsnorm", ffn="swiglu", n_kv_heads=2, bias=False)


def _breaks(fn, *args) -> list[str]:
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*args)
    return [str(b.reason).splitlines()[0] for b in explanation.break_reasons]


def _gpt(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig.preset("tiny", vocab_size=101, max_len=48, **overrides)).eval()


@pytest.mark.parametrize("overrides", [{}, LLAMA, {"position": "sinusoidal"}, {"position": "alibi"}],
                         ids=["gpt2", "llama", "sinusoidal", "alibi"])
def test_gpt_forward_and_loss_have_no_graph_breaks(overrides):
    model = _gpt(**overrides).train()
    ids = torch.randint(0, 101, (2, 16))
    assert _breaks(lambda ids: model.loss(ids, ids), ids) == []


def test_bert_and_t5_forward_and_loss_have_no_graph_breaks():
    torch.manual_seed(0)
    bert = BERT(ModelConfig.preset("bert-tiny", vocab_size=101))
    t5 = T5(ModelConfig.preset("t5-tiny", vocab_size=101))
    ids = torch.randint(0, 101, (2, 16))

    def bert_loss(ids: torch.Tensor) -> torch.Tensor:
        out = bert(ids, torch.zeros_like(ids), attention_mask=torch.ones_like(ids))
        return F.cross_entropy(out.mlm_logits.flatten(0, 1), ids.flatten()) + out.nsp_logits.sum()

    def t5_loss(src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(t5(src, tgt).flatten(0, 1), tgt.flatten())

    assert _breaks(bert_loss, ids) == []
    assert _breaks(t5_loss, ids, ids) == []


@pytest.mark.parametrize("static", [False, True], ids=["KVCache", "StaticKVCache"])
def test_a_cached_decoding_step_has_no_graph_breaks(static):
    model = _gpt(**LLAMA)
    cache = model.make_cache(1, 32, static=static)
    prompt = torch.randint(0, 101, (1, 5))
    with torch.no_grad():
        model(prompt, cache=cache, positions=torch.arange(5) if static else None)
        step = torch.randint(0, 101, (1, 1))
        pos = torch.tensor([5]) if static else None
        assert _breaks(lambda t: model(t, cache=cache, positions=pos)[:, -1], step) == []


def test_value_checks_still_run_in_eager_mode():
    model = _gpt()
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 101\)"):
        model(torch.tensor([[0, 101]]))


@pytest.mark.parametrize("overrides", [{}, LLAMA, {"position": "sinusoidal"}, {"position": "none"}],
                         ids=["gpt2", "llama", "sinusoidal", "none"])
def test_static_cache_gives_the_logits_of_the_dynamic_cache(overrides):
    model = _gpt(**overrides)
    ids = torch.randint(0, 101, (2, 12))
    dynamic, static = model.make_cache(2, 20), model.make_cache(2, 20, static=True)
    with torch.no_grad():
        expected = [model(ids[:, :7], cache=dynamic)] + [model(ids[:, t : t + 1], cache=dynamic) for t in range(7, 12)]
        got = [model(ids[:, :7], cache=static, positions=torch.arange(7))]
        got += [model(ids[:, t : t + 1], cache=static, positions=torch.tensor([t])) for t in range(7, 12)]
        full = model(ids)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(got, 1), full, atol=1e-5, rtol=1e-5)  # and equal to no cache


def test_static_cache_ignores_stale_slots_of_an_earlier_sequence():
    model = _gpt()
    fast = CompiledGenerator(model, 1, 30, compile=False)
    first = fast.generate(torch.randint(0, 101, (1, 20)), 10, temperature=0)  # fills all 30 slots
    prompt = torch.randint(0, 101, (1, 4))
    assert first.shape == (1, 30)
    assert torch.equal(fast.generate(prompt, 12, temperature=0), generate(model, prompt, 12, temperature=0))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_eager_static_decoding_equals_generate(temperature):
    model = _gpt(**LLAMA)
    prompt = torch.randint(0, 101, (3, 6))
    fast = CompiledGenerator(model, 3, 40, compile=False)
    a = generate(model, prompt, 20, temperature=temperature, top_k=20, generator=torch.Generator().manual_seed(1))
    b = fast.generate(prompt, 20, temperature=temperature, top_k=20, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_compiled_step_equals_the_eager_step_on_cpu():
    model = _gpt()
    prompt = torch.randint(0, 101, (2, 5))
    fast = CompiledGenerator(model, 2, 40)  # inductor's C++ backend on the CPU
    out = fast.generate(prompt, 24, temperature=0)
    assert torch.equal(out, generate(model, prompt, 24, temperature=0))
    _assert_cache_holds(model, fast, out)
    eager = CompiledGenerator(model, 2, 40, compile=False)
    tok, pos = prompt[:, -1:], torch.tensor([4])
    with torch.no_grad():
        eager.generate(prompt[:, :4], 1, temperature=0)  # both caches now hold the same 4 tokens
        fast.generate(prompt[:, :4], 1, temperature=0)
        torch.testing.assert_close(fast.step(tok, pos), eager.step(tok, pos), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["recorded-graph", "graph-trees"])
def test_cuda_graph_decoding_equals_eager_decoding(mode):
    model = _gpt(**LLAMA).cuda()
    prompt = torch.randint(0, 101, (1, 5), device="cuda")
    fast = CompiledGenerator(model, 1, 40, mode=mode)
    expected = generate(model, prompt, 30, temperature=0)
    for _ in range(3):  # recording, then replays
        assert torch.equal(fast.generate(prompt, 30, temperature=0), expected)
        _assert_cache_holds(model, fast, expected)


def _assert_cache_holds(model: GPT, fast: CompiledGenerator, tokens: torch.Tensor) -> None:
    """The static cache holds the keys and values of every token but the last, as a KVCache would."""
    reference = model.make_cache(tokens.shape[0], tokens.shape[1])
    with torch.no_grad():
        model(tokens[:, :-1], cache=reference)
    n = tokens.shape[1] - 1
    for layer in range(len(fast.cache)):
        torch.testing.assert_close(fast.cache.keys[layer][:, :, :n], reference.keys[layer][:, :, :n], atol=1e-4,
                                   rtol=1e-4)
        torch.testing.assert_close(fast.cache.values[layer][:, :, :n], reference.values[layer][:, :, :n],
                                   atol=1e-4, rtol=1e-4)


def test_static_cache_bad_input():
    model = _gpt()
    with pytest.raises(ValueError, match="position must not be 'alibi'"):
        CompiledGenerator(_gpt(position="alibi"))
    with pytest.raises(ValueError, match="max_len must be <= the model's max_len=48"):
        CompiledGenerator(model, 1, 49)
    fast = CompiledGenerator(model, 2, 20, compile=False)
    with pytest.raises(ValueError, match="ids must hold batch_size=2 prompts, got 1"):
        fast.generate(torch.zeros(1, 4, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="= 21 exceeds the cache's max_len=20"):
        fast.generate(torch.zeros(2, 4, dtype=torch.long), 17)
    cache = model.make_cache(1, 20, static=True)
    assert isinstance(cache, StaticKVCache) and cache.max_len == 20
    ids = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="needs positions of shape"):
        model(ids, cache=cache)
    with pytest.raises(ValueError, match="attention_mask .* not supported with a StaticKVCache"):
        model(ids, cache=cache, positions=torch.arange(3), attention_mask=torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"positions must be an integer tensor of shape \(new,\)=\(3,\)"):
        cache.update(0, torch.zeros(1, 4, 3, 16), torch.zeros(1, 4, 3, 16), torch.arange(2))
    with pytest.raises(ValueError, match="layer must be an int in"):
        cache.update(2, torch.zeros(1, 4, 3, 16), torch.zeros(1, 4, 3, 16), torch.arange(3))
    attn = MultiHeadAttention(16, 2)
    with pytest.raises(TypeError, match="StaticKVCache serves self-attention only"):
        attn(torch.zeros(1, 1, 16), context=torch.zeros(1, 3, 16), cache=StaticKVCache(1, 1, 2, 8, 4))
    with pytest.raises(ValueError, match="position='t5'"):
        T5(ModelConfig.preset("t5-tiny", vocab_size=101)).decoder(torch.zeros(1, 1, 64), cache=StaticKVCache(
            2, 1, 4, 16, 8), positions=torch.tensor([0]))


def test_static_cache_memory_equals_the_dynamic_caches():
    model = _gpt(**LLAMA)
    assert model.make_cache(3, 17, static=True).memory_bytes == model.make_cache(3, 17).memory_bytes
    assert isinstance(model.make_cache(1), KVCache)


def test_flops_per_token_matches_pytorchs_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    config = ModelConfig.preset("tiny", vocab_size=1000, position="none", bias=False, max_len=128)
    model = GPT(config)
    ids = torch.randint(0, 1000, (2, 128))
    with FlopCounterMode(display=False) as counter:  # need_weights: attention as plain matmuls, which it counts
        F.cross_entropy(model(ids, need_weights=True).flatten(0, 1), ids.flatten()).backward()
    n_params = sum(p.numel() for p in model.parameters())
    formula = flops_per_token(n_params, config.n_layers, 128, config.d_model)
    counted = counter.get_total_flops() / ids.numel()
    # the formula's 6N also credits the norms' gains, which take no matrix multiply (with position="none"
    # there is no position table, which would be credited the same way)
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert counted == pytest.approx(formula - 6 * norms, rel=1e-3)
    assert formula == 6 * n_params + 12 * config.n_layers * 128 * config.d_model


def test_mfu_and_known_peaks(monkeypatch):
    assert mfu(400e3, 860e6, 989e12) == pytest.approx(400e3 * 860e6 / 989e12)
    assert peak_flops("cpu") is None
    for name, peak in [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H200", 989e12),
                       ("NVIDIA H200 NVL", 835e12),
                       ("NVIDIA A100-SXM4-80GB", 312e12), ("Some Future GPU", None)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert peak_flops("cuda") == peak, name
    assert all(v > 0 for v in PEAK_BF16_FLOPS.values())
    with pytest.raises(ValueError, match="tokens_per_second must be a positive"):
        mfu(0, 1, 1)
    with pytest.raises(ValueError, match="seq_len must be an int >= 1"):
        flops_per_token(10, 1, 0, 4)
