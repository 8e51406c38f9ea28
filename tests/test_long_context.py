"""Tests for the long-context settings of ModelConfig: sliding_window (Mistral) and rope_scaling."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from companion.attention import MultiHeadAttention
from companion.config import ModelConfig, RopeScaling
from companion.generation import generate
from companion.models.gpt import GPT
from companion.positional import RotaryEmbedding
from tests.hf_parity import randomize_

VOCAB = 13


def _gpt(**kw) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(**{"vocab_size": VOCAB, "d_model": 16, "n_layers": 1, "n_heads": 2, "max_len": 64,
                            "position": "rope", "norm": "rmsnorm", "ffn": "swiglu", "bias": False, "init_std": None,
                            **kw})
    return GPT(config).eval()


def _ids(batch: int, seq: int, vocab: int = VOCAB, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("changes, match", [
    ({"sliding_window": 0}, "sliding_window must be an int >= 1, got 0"),
    ({"sliding_window": 2.5}, "sliding_window must be an int >= 1"),
    ({"sliding_window": True}, "sliding_window must be an int >= 1"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope_scaling's rope_type must be one of"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0.5}}, "rope_scaling's factor must be a finite number >= 1"),
    ({"rope_scaling": {"rope_type": "linear"}}, "rope_scaling must be None, a RopeScaling or a dict"),
    ({"rope_scaling": ("linear", 2.0)}, "rope_scaling must be None, a RopeScaling or a dict"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "position": "learned"},
     "rope_scaling needs position='rope'"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "head_dim": 2}, "needs head_dim >= 4"),
])
def test_bad_long_context_fields_are_named(changes, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**{"vocab_size": 10, "d_model": 16, "n_heads": 4, "position": "rope", **changes})


def test_rope_scaling_dict_becomes_a_frozen_hashable_value():
    from_dict = ModelConfig(vocab_size=10, position="rope", rope_scaling={"rope_type": "linear", "factor": 4})
    assert from_dict.rope_scaling == RopeScaling("linear", 4.0) and isinstance(from_dict.rope_scaling.factor, float)
    assert from_dict == from_dict.replace(rope_scaling=RopeScaling("linear", 4.0))
    assert hash(from_dict) == hash(from_dict.replace())  # still usable as a dict key, as a frozen config should be
    assert from_dict != from_dict.replace(rope_scaling={"rope_type": "dynamic", "factor": 4.0})


# ------------------------------------------------------------------------------- sliding window


def _reference_attention(mha: MultiHeadAttention, x: torch.Tensor, window: int) -> torch.Tensor:
    """Dense masked softmax attention in float64; Mistral's rule: query i sees key j iff 0 <= i - j < window."""
    x, w_in, w_out = x.double(), mha.in_proj.weight.double(), mha.out_proj.weight.double()
    h, hkv, d = mha.n_heads, mha.n_kv_heads, mha.head_dim
    q, k, v = (x @ w_in.T).split([h * d, hkv * d, hkv * d], dim=-1)
    b, n, _ = x.shape
    q = q.view(b, n, h, d).transpose(1, 2)
    k, v = (t.view(b, n, hkv, d).transpose(1, 2).repeat_interleave(h // hkv, dim=1) for t in (k, v))
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    seen = (i - j >= 0) & (i - j < window)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~seen, float("-inf"))
    out = scores.softmax(-1) @ v
    return out.transpose(1, 2).reshape(b, n, h * d) @ w_out.T


@pytest.mark.parametrize("window", [1, 3, 7, 20])
@pytest.mark.parametrize("need_weights", [False, True])
def test_windowed_attention_matches_a_dense_float64_reference(window, need_weights):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, n_kv_heads=2, bias=False, sliding_window=window).eval()
    x = torch.randn(2, 11, 16)
    out, weights = mha(x, causal=True, need_weights=need_weights)
    torch.testing.assert_close(out.double(), _reference_attention(mha, x, window), atol=1e-5, rtol=1e-5)
    if need_weights:  # exactly min(window, i + 1) keys per query carry weight
        counts = (weights > 0).sum(-1)
        torch.testing.assert_close(counts, torch.arange(1, 12).clamp(max=window).expand_as(counts))


def test_a_window_needs_causal_self_attention():
    mha = MultiHeadAttention(16, 4, sliding_window=3)
    with pytest.raises(ValueError, match="sliding_window=3"):
        mha(torch.randn(1, 5, 16))
    with pytest.raises(ValueError, match="sliding_window=3"):
        mha(torch.randn(1, 5, 16), context=torch.randn(1, 4, 16), causal=True)


@pytest.mark.parametrize("window", [2, 5])
def test_one_layer_sees_exactly_the_last_window_tokens(window):
    model, t = _gpt(sliding_window=window), 14
    ids = _ids(1, 16)
    logits = model(ids)[0, t]
    outside, inside = ids.clone(), ids.clone()
    outside[0, t - window] = (outside[0, t - window] + 1) % VOCAB  # window keys: t - window + 1 ... t
    inside[0, t - window + 1] = (inside[0, t - window + 1] + 1) % VOCAB
    torch.testing.assert_close(model(outside)[0, t], logits)
    assert not torch.allclose(model(inside)[0, t], logits, atol=1e-4)


def test_layers_widen_the_receptive_field_by_window_minus_one_each():
    window, n_layers, t = 3, 3, 15
    model = _gpt(sliding_window=window, n_layers=n_layers)
    ids = _ids(1, 16)
    logits = model(ids)[0, t]
    reach = (window - 1) * n_layers  # the furthest token that can still reach position t
    far, near = ids.clone(), ids.clone()
    far[0, t - reach - 1] = (far[0, t - reach - 1] + 1) % VOCAB
    near[0, t - reach] = (near[0, t - reach] + 1) % VOCAB
    torch.testing.assert_close(model(far)[0, t], logits)
    assert not torch.allclose(model(near)[0, t], logits, atol=1e-4)


def test_a_window_as_long_as_the_sequence_is_full_causal_attention():
    ids = _ids(2, 12)
    full, windowed = _gpt(n_layers=2), _gpt(n_layers=2, sliding_window=12)
    torch.testing.assert_close(windowed(ids), full(ids), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(_gpt(n_layers=2, sliding_window=4)(ids), full(ids), atol=1e-4)


@pytest.mark.parametrize("position", ["rope", "alibi", "learned"])
def test_cached_decoding_equals_the_full_forward_with_a_short_window(position):
    model = _gpt(n_layers=2, sliding_window=4, position=position)
    ids = _ids(2, 20)
    full = model(ids)
    cache = model.make_cache(2, 20)
    steps = [model(ids[:, :5], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(5, 20)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    prompt = ids[:, :3]
    cached = generate(model, prompt, 17, temperature=0)
    torch.testing.assert_close(cached, generate(model, prompt, 17, temperature=0, use_cache=False))


def test_static_cache_decoding_honours_the_window():
    model = _gpt(n_layers=2, sliding_window=3)
    ids = _ids(1, 12)
    cache = model.make_cache(1, 16, static=True)
    steps = [model(ids[:, t : t + 1], cache=cache, positions=torch.tensor([t])) for t in range(12)]
    torch.testing.assert_close(torch.cat(steps, 1), model(ids), atol=1e-5, rtol=1e-5)


def test_encoders_ignore_the_window_and_decoders_apply_it():
    from companion.models.transformer import Transformer

    torch.manual_seed(0)
    config = ModelConfig.preset("transformer-tiny", vocab_size=VOCAB, tgt_vocab_size=VOCAB, n_layers=1,
                                n_decoder_layers=1, sliding_window=2)
    model = Transformer(config).eval()
    src, tgt = _ids(1, 10, VOCAB - 1) + 1, _ids(1, 10, VOCAB - 1, seed=2) + 1  # no padding id 0
    memory, logits = model.encode(src)[0][0, -1], model(src, tgt)[0, 7]
    src_first = src.clone()
    src_first[0, 0] = src[0, 0] % (VOCAB - 1) + 1
    assert not torch.allclose(model.encode(src_first)[0][0, -1], memory, atol=1e-4)  # the encoder sees it all
    outside, inside = tgt.clone(), tgt.clone()
    outside[0, 5], inside[0, 6] = tgt[0, 5] % (VOCAB - 1) + 1, tgt[0, 6] % (VOCAB - 1) + 1
    torch.testing.assert_close(model(src, outside)[0, 7], logits)  # the decoder sees tokens 6 and 7 only
    assert not torch.allclose(model(src, inside)[0, 7], logits, atol=1e-4)


# ------------------------------------------------------------------------------- RoPE scaling


@pytest.mark.parametrize("factor", [2.0, 4.0, 2.5])
def test_linear_scaling_at_factor_times_m_is_plain_rope_at_m(factor):
    x = torch.randn(2, 3, 10, 8)
    m = torch.arange(10) * 3
    scaled = RotaryEmbedding(8, scaling="linear", factor=factor)
    torch.testing.assert_close(scaled(x, factor * m), RotaryEmbedding(8)(x, m.float()), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(scaled(x, m), RotaryEmbedding(8)(x, m), atol=1e-3)


def test_dynamic_scaling_changes_nothing_within_max_len_and_raises_the_base_beyond():
    d, base, factor, max_len = 8, 100.0, 3.0, 16
    dynamic = RotaryEmbedding(d, base, scaling="dynamic", factor=factor, max_len=max_len)
    x = torch.randn(1, 2, 40, d)
    for n in (5, max_len):  # up to max_len tokens: exactly plain RoPE
        short = torch.arange(n)
        torch.testing.assert_close(dynamic(x[:, :, :n], short), RotaryEmbedding(d, base)(x[:, :, :n], short),
                                   atol=0, rtol=0)
    seq = 40  # positions 0 ... 39: the base grows with the largest one, computed here in float64
    new_base = base * (factor * seq / max_len - (factor - 1)) ** (d / (d - 2))
    long = torch.arange(seq)
    torch.testing.assert_close(dynamic(x, long), RotaryEmbedding(d, new_base)(x, long), atol=1e-5, rtol=1e-5)
    angles, plain = dynamic.angles(long.double()), RotaryEmbedding(d, base).angles(long)
    torch.testing.assert_close(angles[:, 0], plain[:, 0])  # the fastest pair turns as before
    assert (angles[1:, 1:] < plain[1:, 1:]).all()  # every slower one turns slower


def test_rotary_scaling_arguments_are_checked():
    with pytest.raises(ValueError, match="scaling must be None, 'linear' or 'dynamic'"):
        RotaryEmbedding(8, scaling="yarn")
    with pytest.raises(ValueError, match="factor must be a finite number >= 1"):
        RotaryEmbedding(8, scaling="linear", factor=0.5)
    with pytest.raises(ValueError, match="max_len must be an int >= 1"):
        RotaryEmbedding(8, scaling="dynamic", factor=2.0)


def test_a_model_with_linear_scaling_is_the_plain_model_at_divided_positions():
    scaled = _gpt(n_layers=2, rope_scaling={"rope_type": "linear", "factor": 4.0})
    plain = _gpt(n_layers=2)
    plain.load_state_dict(scaled.state_dict())
    ids = _ids(2, 24)
    torch.testing.assert_close(scaled(ids), plain(ids, positions=torch.arange(24) / 4.0), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(scaled(ids), plain(ids), atol=1e-4)


# ------------------------------------------------------------------------------- Hugging Face


def _hf_model(name: str, **kw):
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    config = getattr(transformers, f"{name}Config")(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, bos_token_id=None, eos_token_id=None, pad_token_id=0, **kw)
    config._attn_implementation = "eager"
    return randomize_(getattr(transformers, f"{name}ForCausalLM")(config).eval())  # every weight its own


def test_from_hf_mistral_gives_equal_logits_and_greedy_tokens_beyond_the_window():
    hf = _hf_model("Mistral", sliding_window=8, max_position_embeddings=128)
    ours = GPT.from_hf(hf)
    assert ours.config.sliding_window == 8
    ids = _ids(2, 32, vocab=100)
    with torch.no_grad():
        expected = hf(ids).logits
    torch.testing.assert_close(ours(ids), expected, atol=1e-4, rtol=1e-4)
    unwindowed = GPT(ours.config.replace(sliding_window=None)).eval()
    unwindowed.load_state_dict(ours.state_dict())
    assert not torch.allclose(unwindowed(ids)[:, 8:], expected[:, 8:], atol=1e-2)  # the window matters
    prompt = ids[:, :6]
    with torch.no_grad():
        hf_tokens = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False)
    torch.testing.assert_close(generate(ours, prompt, 20, temperature=0), hf_tokens)


@pytest.mark.parametrize("rope_type, seq", [("linear", 24), ("dynamic", 40), ("dynamic", 12)])
def test_from_hf_llama_with_rope_scaling_gives_equal_logits(rope_type, seq):
    hf = _hf_model("Llama", max_position_embeddings=16,
                   rope_parameters={"rope_type": rope_type, "factor": 2.0, "rope_theta": 10000.0})
    ours = GPT.from_hf(hf)
    assert ours.config.rope_scaling == RopeScaling(rope_type, 2.0)
    ids = _ids(2, seq, vocab=100)
    with torch.no_grad():
        expected = hf(ids).logits
    torch.testing.assert_close(ours(ids), expected, atol=1e-4, rtol=1e-4)
    plain = GPT(ours.config.replace(rope_scaling=None)).eval()
    plain.load_state_dict(ours.state_dict())
    differs = not torch.allclose(plain(ids), expected, atol=1e-3)
    assert differs == (rope_type == "linear" or seq > 16)  # dynamic scaling acts beyond max_len only


def test_from_hf_refuses_other_rope_scalings():
    hf = _hf_model("Llama", max_position_embeddings=16,
                   rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(ValueError, match="RoPE scaling 'yarn'"):
        GPT.from_hf(hf)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_windowed_model_with_scaled_rope_agrees_with_the_cpu():
    model = _gpt(n_layers=2, sliding_window=4, rope_scaling={"rope_type": "dynamic", "factor": 2.0}, max_len=8)
    ids = _ids(2, 20)
    expected = model(ids)
    gpu = model.cuda()
    got = gpu(ids.cuda())
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)
    prompt = ids[:, :3].cuda()
    torch.testing.assert_close(generate(gpu, prompt, 12, temperature=0),
                               generate(gpu, prompt, 12, temperature=0, use_cache=False))
