"""Tests for companion.models.gpt: causality, positions, the cache, parameter counts, HF parity, learning."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from companion.attention import causal_mask
from companion.config import POSITIONS, ModelConfig
from companion.models.gpt import GPT, CausalClassifier
from companion.positional import alibi_bias
from companion.utils import count_parameters
from tests.hf_parity import randomize_

VOCAB = 11


def _model(position: str = "learned", **kw) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(**{"vocab_size": VOCAB, "d_model": 16, "n_layers": 2, "n_heads": 2, "max_len": 8,
                            "position": position, **kw})
    return GPT(config).eval()


@pytest.mark.parametrize("position", POSITIONS)
def test_logits_shape_and_causality(position):
    model = _model(position)
    ids = torch.randint(0, VOCAB, (3, 8))
    logits = model(ids)
    assert logits.shape == (3, 8, VOCAB)
    changed = ids.clone()
    changed[:, 5] = (changed[:, 5] + 1) % VOCAB
    new = model(changed)
    torch.testing.assert_close(new[:, :5], logits[:, :5])  # the past never sees the future
    assert not torch.allclose(new[:, 5:], logits[:, 5:])


@pytest.mark.parametrize("position", [p for p in POSITIONS if p != "learned"])
def test_every_scheme_but_learned_runs_beyond_the_training_length(position):
    model = _model(position)
    ids = torch.randint(0, VOCAB, (2, 32))  # 4x max_len
    long = model(ids)
    assert long.shape == (2, 32, VOCAB) and torch.isfinite(long).all()
    torch.testing.assert_close(long[:, :8], model(ids[:, :8]), atol=1e-5, rtol=1e-5)


def test_learned_positions_cannot_extrapolate():
    model = _model("learned")
    model(torch.randint(0, VOCAB, (2, 8)))
    with pytest.raises(ValueError, match="no embedding for position 8"):
        model(torch.randint(0, VOCAB, (2, 9)))


def test_positional_parameters_are_where_each_scheme_puts_them():
    base = count_parameters(_model("none"))
    for position in ("sinusoidal", "rope", "alibi"):  # formulas: no parameters
        assert count_parameters(_model(position)) == base
    assert count_parameters(_model("learned", max_len=8)) == base + 8 * 16
    assert count_parameters(_model("t5", t5_num_buckets=16, t5_max_distance=32)) == base + 16 * 2


def test_position_schemes_are_built_once_and_shared_by_the_blocks():
    rope = _model("rope")
    assert rope.layers[0].self_attn.rotary is rope.layers[1].self_attn.rotary is rope.stack.positions.rotary
    t5 = _model("t5")
    assert t5.stack.positions.bias(5, 5).shape == (2, 5, 5)
    assert sum("relative_attention_bias" in n for n, _ in t5.named_parameters()) == 1  # one table, all layers
    torch.testing.assert_close(_model("alibi").stack.positions.bias(5, 5), alibi_bias(2, 5, causal=True))
    assert _model("none").stack.positions.bias(5, 5) is None and _model("rope").stack.positions.bias(5, 5) is None


def test_blocks_are_causal_pre_norm_blocks():
    """Each block computes h = x + Attn(Norm(x)) with a causal mask, then h + FFN(Norm(h))."""
    model = _model("none", n_layers=1, ffn="swiglu", norm="rmsnorm")
    block = model.layers[0]
    x = torch.randn(2, 5, 16)
    attended, _ = block.self_attn(block.self_norm(x), mask=causal_mask(5))
    h = x + attended
    torch.testing.assert_close(block(x, causal=True), h + block.ffn(block.ffn_norm(h)))
    assert type(block.ffn).__name__ == "SwiGLU" and type(model.stack.norm).__name__ == "RMSNorm"


def test_scale_embeddings_multiplies_by_sqrt_d_model():
    plain, scaled = _model("none"), _model("none", scale_embeddings=True)
    scaled.load_state_dict(plain.state_dict())
    ids = torch.randint(0, VOCAB, (1, 5))
    x = plain.tok_emb(ids)
    torch.testing.assert_close(scaled.stack(x * 4.0), scaled.hidden_states(ids))  # sqrt(16) = 4
    assert 0.15 < _model("none", scale_embeddings=True).tok_emb.weight.std().item() < 0.35  # N(0, 1/d_model)


def test_tied_embeddings_are_one_parameter():
    model = _model()
    assert model.head.weight is model.tok_emb.weight
    untied = _model(tie_embeddings=False)
    assert count_parameters(untied) == count_parameters(model) + VOCAB * 16


def test_gpt2_small_has_the_published_parameter_count():
    # GPT2LMHeadModel(GPT2Config()) has 124,439,808 parameters (the head is tied to wte).
    assert count_parameters(GPT(ModelConfig.preset("gpt2-small"))) == 124_439_808


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("n_kv_heads", [None, 1])
def test_cached_logits_equal_uncached(position, n_kv_heads):
    model = _model(position, n_heads=4, n_kv_heads=n_kv_heads, max_len=16)
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        full = model(ids)
        cache = model.make_cache(2)
        parts = [model(ids[:, :5], cache=cache)]  # the prompt, then one token at a time
        parts += [model(ids[:, t : t + 1], cache=cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.seq_len() == 12 and cache.keys.shape == (2, 2, n_kv_heads or 4, 16, 4)


def test_hidden_states_and_cache_rewind():
    model = _model("rope", max_len=16)
    ids = torch.randint(0, VOCAB, (2, 9))
    torch.testing.assert_close(model.head(model.hidden_states(ids)), model(ids))
    cache = model.make_cache(2)
    with torch.no_grad():
        model(ids, cache=cache)
        cache.crop(5)  # rewind: as if only the first 5 tokens had been seen
        again = model(ids[:, 5:], cache=cache)
    torch.testing.assert_close(again, model(ids)[:, 5:], atol=1e-5, rtol=1e-5)


def test_an_extra_mask_gives_local_attention():
    from companion.attention import sliding_window_mask

    model = _model("none", max_len=16, n_layers=1)
    ids = torch.randint(0, VOCAB, (1, 10))
    local = model(ids, mask=sliding_window_mask(10, window=2))
    # one layer with a window of 2: position 9 sees only tokens 7..9, the rest of the prefix does not matter
    torch.testing.assert_close(local[:, -1], model(ids[:, 7:], positions=torch.arange(7, 10))[:, -1],
                               atol=1e-5, rtol=1e-5)


def test_rope_accepts_fractional_positions():
    model = _model("rope", max_len=16)
    ids = torch.randint(0, VOCAB, (1, 6))
    halved = model(ids, positions=torch.arange(6) / 2)  # position interpolation
    assert halved.shape == (1, 6, VOCAB) and not torch.allclose(halved, model(ids))


def test_padded_batch_gives_each_sequence_its_own_logits():
    model = _model("rope", max_len=16)
    short = torch.randint(1, VOCAB, (1, 5))
    padded = torch.cat([short, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.tensor([[1] * 5 + [0] * 3])
    torch.testing.assert_close(model(padded, attention_mask=mask)[:, :5], model(short), atol=1e-5, rtol=1e-5)
    left = torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1)  # left padding: keys masked
    left_mask = torch.tensor([[0] * 3 + [1] * 5])
    pos = torch.arange(5).view(1, 5)
    expected = model(short, positions=pos)
    got = model(left, attention_mask=left_mask, positions=torch.cat([torch.zeros(1, 3, dtype=torch.long), pos], 1))
    torch.testing.assert_close(got[:, 3:], expected, atol=1e-5, rtol=1e-5)


def _hf_gpt2(**kw):
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     bos_token_id=0, eos_token_id=0, **kw)
    return randomize_(transformers.GPT2LMHeadModel(config).eval())


def _hf_llama(**kw):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0, **kw)
    return randomize_(transformers.LlamaForCausalLM(config).eval())  # every weight its own: a swap would show


@pytest.mark.parametrize("make", [_hf_gpt2, lambda: _hf_gpt2(activation_function="relu", tie_word_embeddings=False),
                                  _hf_llama, lambda: _hf_llama(attention_bias=True, mlp_bias=True,
                                                               tie_word_embeddings=True)])
def test_from_hf_gives_equal_logits_on_a_padded_batch(make):
    hf = make()
    ours = GPT.from_hf(hf)
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=1e-4)
    assert count_parameters(ours) == count_parameters(hf)


def test_from_hf_refuses_what_it_cannot_convert():
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        GPT.from_hf(_hf_gpt2(scale_attn_by_inverse_layer_idx=True))
    with pytest.raises(ValueError, match="hidden_act"):
        GPT.from_hf(_hf_llama(hidden_act="gelu"))
    with pytest.raises(TypeError, match="GPT2LMHeadModel, LlamaForCausalLM or MistralForCausalLM"):
        GPT.from_hf(torch.nn.Linear(2, 2))


def _train_three_back(position: str, steps: int = 100) -> float:
    """Train a 1-layer model to output the token 3 steps back; return the last loss."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=VOCAB, d_model=32, n_layers=1, n_heads=2, position=position, max_len=12)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (16, 12), generator=g)
        loss = F.cross_entropy(model(ids)[:, 3:].reshape(-1, VOCAB), ids[:, :-3].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


@pytest.mark.parametrize("position", ["learned", "rope", "t5"])
def test_positions_let_one_layer_look_exactly_three_back(position):
    # Random tokens: only the position says which key is 3 back. Chance is about log(11) = 2.4.
    assert _train_three_back(position) < 0.3


@pytest.mark.parametrize("position", ["none", "alibi"])
def test_without_a_relative_offset_one_layer_cannot_look_three_back(position):
    # With no positions, or only ALiBi's penalty that falls monotonically with distance, one layer
    # cannot prefer the key 3 back over nearer ones: the loss stays near guessing among the
    # tokens seen so far (about 1.7-2.0 nats).
    assert _train_three_back(position) > 1.0


def test_bad_inputs_raise():
    model = _model()
    with pytest.raises(TypeError, match="config must be a companion ModelConfig"):
        GPT({"vocab_size": 3})
    with pytest.raises(ValueError, match=r"ids must be an integer tensor of shape \(batch, seq\)"):
        model(torch.randint(0, VOCAB, (8,)))
    with pytest.raises(ValueError, match="integer"):
        model(torch.rand(2, 8))
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 11\), got min 0, max 11"):
        model(torch.tensor([[0, 11]]))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, past \+ seq\) = \(1, 2\)"):
        model(torch.tensor([[0, 1]]), attention_mask=torch.ones(1, 3))
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        model(torch.tensor([[0, 1]]), cache={})
    cache = model.make_cache(1, max_len=3)
    model(torch.tensor([[0, 1]]), cache=cache)
    with pytest.raises(ValueError, match="holds max_len=3 tokens"):
        model(torch.tensor([[0, 1]]), cache=cache)


def test_causal_classifier_reads_one_position_and_ignores_later_tokens():
    torch.manual_seed(0)
    gpt = GPT(ModelConfig.preset("tiny", vocab_size=50, max_len=16)).eval()
    ids = torch.randint(0, 50, (3, 10))
    last, first = CausalClassifier(gpt, 4), CausalClassifier(gpt, 4, position=0)
    with torch.no_grad():
        logits = last(ids)
        assert logits.shape == (3, 4)
        torch.testing.assert_close(logits, last.head(gpt.hidden_states(ids)[:, -1]))
        changed = ids.clone()
        changed[:, 1:] = (changed[:, 1:] + 1) % 50  # every token after the first
        torch.testing.assert_close(first(changed), first(ids))  # position 0 sees only itself
        assert (last(changed) - logits).abs().max() > 1e-3  # the last position sees them all


def test_causal_classifier_bad_arguments_raise():
    gpt = GPT(ModelConfig.preset("tiny", vocab_size=50, max_len=16))
    with pytest.raises(TypeError, match="gpt must be a companion GPT"):
        CausalClassifier(torch.nn.Linear(2, 2), 3)
    with pytest.raises(ValueError, match="n_classes must be an int >= 2"):
        CausalClassifier(gpt, 1)
    with pytest.raises(ValueError, match="position must be an int"):
        CausalClassifier(gpt, 3, position=1.5)
    with pytest.raises(ValueError, match="position 12 is outside sequences of length 10"):
        CausalClassifier(gpt, 3, position=12)(torch.zeros(2, 10, dtype=torch.long))


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_a_rolling_cache_decodes_a_sliding_window_gpt_like_the_full_forward(n_kv_heads):
    torch.manual_seed(0)
    config = ModelConfig.preset("llama-tiny", sliding_window=6, n_kv_heads=n_kv_heads)
    model = GPT(config).eval()
    ids = torch.randint(config.vocab_size, (2, 40))
    with torch.no_grad():
        full = model(ids)  # the chunked local kernel over the whole sequence
        cache = model.make_cache(2, rolling=True)
        pieces = [model(ids[:, :9], cache=cache), model(ids[:, 9:14], cache=cache)]  # a prompt, then a chunk
        pieces += [model(ids[:, t:t + 1], cache=cache) for t in range(14, 40)]  # then one token at a time
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-4, rtol=0)
    assert cache.seq_len() == 40 and cache.stored() == 6  # the last sliding_window tokens, and no more
    assert cache.memory_bytes == 2 * config.n_layers * 2 * n_kv_heads * config.resolved_head_dim * 6 * 4


def test_a_rolling_cache_is_refused_where_it_cannot_serve():
    model = GPT(ModelConfig.preset("llama-tiny", sliding_window=6)).eval()
    ids = torch.randint(256, (1, 4))
    with pytest.raises(ValueError, match="sliding_window"):
        GPT(ModelConfig.preset("llama-tiny")).make_cache(1, rolling=True)
    with pytest.raises(ValueError, match="attention_mask"):
        model(ids, cache=model.make_cache(1, rolling=True), attention_mask=torch.ones(1, 4))
    other = GPT(ModelConfig.preset("llama-tiny", sliding_window=4)).eval()
    with pytest.raises(ValueError, match="window"):
        other(ids, cache=model.make_cache(1, rolling=True))
    alibi = GPT(ModelConfig.preset("llama-tiny", sliding_window=6, position="alibi")).eval()
    with pytest.raises(ValueError, match="alibi"):
        alibi(ids, cache=alibi.make_cache(1, rolling=True))
