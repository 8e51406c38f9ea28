"""Tests for batched generation of prompts of different lengths: left padding, attention mask, positions, EOS.

The key property: each row of a left-padded batch gets the tokens its prompt gets alone, for every
position scheme, with and without the KV cache. The models run in float64, so that batching's
different summation orders cannot flip a greedy argmax.
"""

import pytest
import torch

from companion.config import ModelConfig
from companion.generation import generate, pad_prompts
from companion.models.gpt import GPT

VOCAB = 50
PROMPTS = [[3, 14, 15, 9, 26, 5, 35], [8, 9, 7], [1, 41, 42, 13, 5], [17]]  # lengths 7, 3, 5, 1


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # models this small only lose from threads
    yield
    torch.set_num_threads(threads)


def _gpt(preset: str = "tiny", **kw) -> GPT:
    # untied: a randomly initialised model with a tied head mostly repeats its last token, which
    # would make "the same tokens" an easy test
    torch.manual_seed(0)
    config = ModelConfig.preset(preset, **{"vocab_size": VOCAB, "max_len": 64, "tie_embeddings": False, **kw})
    return GPT(config).double()


def _alone(model: GPT, prompt: list[int], n: int, **kw) -> torch.Tensor:
    """The new tokens of ``prompt`` generated on its own (no padding, no mask: the unbatched path)."""
    out = generate(model, torch.tensor([prompt]), n, **kw)
    return out[0, len(prompt):]


# ------------------------------------------------------------------ pad_prompts


def test_pad_prompts_left_pads_lists_and_tensors():
    ids, mask = pad_prompts([[5, 6, 7], [8], torch.tensor([1, 2])], pad_id=0)
    assert torch.equal(ids, torch.tensor([[5, 6, 7], [0, 0, 8], [0, 1, 2]]))
    assert torch.equal(mask, torch.tensor([[1, 1, 1], [0, 0, 1], [0, 1, 1]]))
    assert ids.dtype == mask.dtype == torch.long
    ids, mask = pad_prompts([[4]], pad_id=9)
    assert torch.equal(ids, torch.tensor([[4]])) and torch.equal(mask, torch.tensor([[1]]))


def test_pad_prompts_bad_arguments():
    with pytest.raises(ValueError, match="prompts must be a non-empty list"):
        pad_prompts([], pad_id=0)
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty"):
        pad_prompts([[1], []], pad_id=0)
    with pytest.raises(ValueError, match=r"prompts\[0\] must be a list of ints or a 1-D integer tensor"):
        pad_prompts([torch.ones(3)], pad_id=0)
    with pytest.raises(ValueError, match=r"prompts\[0\] must be a list of ints"):
        pad_prompts([[1.5]], pad_id=0)
    with pytest.raises(ValueError, match="pad_id must be an int >= 0"):
        pad_prompts([[1]], pad_id=-1)


# ------------------------------------------------------------------ each row = that prompt alone

ARCHITECTURES = {
    "learned": dict(preset="tiny"),
    "sinusoidal": dict(preset="tiny", position="sinusoidal"),
    "rope": dict(preset="llama-tiny"),  # RoPE, RMSNorm, SwiGLU, grouped-query attention
    "rope-window": dict(preset="llama-tiny", sliding_window=4),  # Mistral: the window slides past the padding
    "alibi": dict(preset="tiny", position="alibi"),
    "t5": dict(preset="tiny", position="t5"),
}


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_each_row_of_a_padded_batch_gets_the_tokens_of_its_prompt_alone(arch, use_cache):
    model = _gpt(**ARCHITECTURES[arch])
    ids, mask = pad_prompts(PROMPTS, pad_id=0)
    out = generate(model, ids, 12, temperature=0, attention_mask=mask, use_cache=use_cache)
    assert out.shape == (4, 7 + 12) and torch.equal(out[:, :7], ids)
    for r, prompt in enumerate(PROMPTS):
        assert torch.equal(out[r, 7:], _alone(model, prompt, 12, temperature=0)), f"row {r}"
    # what padding must fix: without the mask (and its positions) the short rows change
    unmasked = generate(model, ids, 12, temperature=0, use_cache=use_cache)
    assert not torch.equal(unmasked[1:, 7:], out[1:, 7:])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("arch", ["learned", "rope"])
def test_padded_rows_equal_their_prompts_alone_on_cuda(arch):
    model = _gpt(**ARCHITECTURES[arch]).cuda()
    ids, mask = pad_prompts([torch.tensor(p, device="cuda") for p in PROMPTS], pad_id=0)
    assert ids.is_cuda and mask.is_cuda
    out = generate(model, ids, 12, temperature=0, attention_mask=mask)
    for r, prompt in enumerate(PROMPTS):
        alone = generate(model, torch.tensor([prompt], device="cuda"), 12, temperature=0)
        assert torch.equal(out[r, 7:], alone[0, len(prompt):]), f"row {r}"


def test_the_pad_token_and_the_amount_of_padding_do_not_matter():
    model = _gpt("llama-tiny")
    ids, mask = pad_prompts(PROMPTS, pad_id=0)
    wide, _ = pad_prompts(PROMPTS, pad_id=33)
    wide = torch.cat([torch.full((4, 5), 33), wide], dim=1)  # 5 more columns of padding, another pad id
    wide_mask = torch.cat([torch.zeros(4, 5, dtype=torch.long), mask], dim=1)
    greedy = generate(model, ids, 10, temperature=0, attention_mask=mask)
    assert torch.equal(generate(model, wide, 10, temperature=0, attention_mask=wide_mask)[:, 12:], greedy[:, 7:])


def test_sampled_rows_do_not_depend_on_padding_cache_or_the_other_rows():
    # With one seed, the sampler draws the same random numbers for row r whatever the prompts
    # (torch.multinomial draws one exponential per vocabulary entry, row after row), so the
    # sampled tokens of a row must not change with the padding, the cache or the other rows.
    model = _gpt("tiny")
    kw = dict(temperature=1.0, top_k=20, top_p=0.95)

    def sample(prompts, extra_pad=0, **more):
        ids, mask = pad_prompts(prompts, pad_id=0)
        ids = torch.cat([torch.full((len(prompts), extra_pad), 7), ids], dim=1)
        mask = torch.cat([torch.zeros(len(prompts), extra_pad, dtype=torch.long), mask], dim=1)
        out = generate(model, ids, 15, attention_mask=mask, generator=torch.Generator().manual_seed(3), **kw, **more)
        return out[:, ids.shape[1]:]

    ref = sample(PROMPTS)
    assert torch.equal(sample(PROMPTS, use_cache=False), ref)
    assert torch.equal(sample(PROMPTS, extra_pad=6), ref)
    others = [[40, 41], PROMPTS[1], [2] * 9, [12, 13, 14]]  # rows 0, 2, 3 replaced, row 1 kept
    assert torch.equal(sample(others)[1], ref[1])
    assert not torch.equal(sample(others)[0], ref[0])  # the other rows did change


# ------------------------------------------------------------------ EOS


def test_a_row_that_emits_eos_is_padded_and_the_others_continue():
    model = _gpt("llama-tiny")
    ids, mask = pad_prompts(PROMPTS, pad_id=0)
    free = generate(model, ids, 12, temperature=0, attention_mask=mask)[:, 7:]
    eos = int(free[1, 2])  # row 1's third new token
    first = [(row == eos).nonzero().flatten().tolist() for row in free]
    out = generate(model, ids, 12, temperature=0, attention_mask=mask, eos_id=eos, pad_id=49)[:, 7:]
    for r, hits in enumerate(first):
        if hits:  # finished at its first EOS, then pad_id
            k = hits[0]
            assert torch.equal(out[r, : k + 1], free[r, : k + 1]) and (out[r, k + 1 :] == 49).all(), f"row {r}"
        else:  # never emitted EOS: unaffected by the others finishing
            assert torch.equal(out[r], free[r, : out.shape[1]]), f"row {r}"
    assert any(not hits for hits in first)  # some row kept going past row 1's EOS
    assert out.shape[1] == 12
    # default fill: EOS repeated (the unpadded behaviour)
    repeated = generate(model, ids, 12, temperature=0, attention_mask=mask, eos_id=eos)[:, 7:]
    assert torch.equal(repeated[1, 2:], torch.full((10,), eos)) and torch.equal(repeated[0], out[0])


def test_generation_stops_when_every_row_has_emitted_eos():
    model = _gpt("tiny")
    ids, mask = pad_prompts(PROMPTS, pad_id=0)
    free = generate(model, ids, 30, temperature=0, attention_mask=mask)[:, 7:]
    common = set(free[0].tolist()).intersection(*(set(row.tolist()) for row in free[1:]))
    assert common, "the test needs a token that every row emits"
    eos = min(common, key=lambda t: max(int((row == t).nonzero()[0]) for row in free))
    last = max(int((row == eos).nonzero()[0]) for row in free)  # the step at which the last row finishes
    assert last < 29
    for use_cache in (True, False):
        out = generate(model, ids, 30, temperature=0, attention_mask=mask, eos_id=eos, pad_id=0, use_cache=use_cache)
        assert out.shape == (4, 7 + last + 1)
        for r, row in enumerate(free):
            k = int((row == eos).nonzero()[0])
            assert torch.equal(out[r, 7 : 7 + k + 1], row[: k + 1]) and (out[r, 7 + k + 1 :] == 0).all()


# ------------------------------------------------------------------ no padding: the old behaviour


@pytest.mark.parametrize("arch", ["learned", "rope", "alibi"])
def test_equal_lengths_with_a_full_mask_are_the_unpadded_path(arch):
    model = _gpt(**ARCHITECTURES[arch]).float()
    ids = torch.randint(0, VOCAB, (3, 6), generator=torch.Generator().manual_seed(1))
    ones = torch.ones_like(ids)
    for temperature in (0, 1):  # greedy and sampled
        old, *masked = (generate(model, ids, 10, temperature=temperature, top_k=10, attention_mask=mask,
                                 generator=torch.Generator().manual_seed(2)) for mask in (None, ones, ones.bool()))
        assert all(torch.equal(m, old) for m in masked)
    # a column of padding in every row runs the masked path: the same tokens (float64 for exact ties)
    model = model.double()
    padded = torch.cat([torch.zeros(3, 1, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(3, 1, dtype=torch.long), ones], dim=1)
    assert torch.equal(generate(model, padded, 10, temperature=0, attention_mask=mask)[:, 7:],
                       generate(model, ids, 10, temperature=0)[:, 6:])


def test_learned_positions_limit_counts_tokens_not_padding():
    model = _gpt("tiny", max_len=10)
    ids, mask = pad_prompts([[1, 2, 3, 4], [5]], pad_id=0)
    assert generate(model, ids, 6, temperature=0, attention_mask=mask).shape == (2, 10)
    with pytest.raises(ValueError, match="exceeds the model's max_len=10"):
        generate(model, ids, 7, temperature=0, attention_mask=mask)
    # a longer padding only: the longest row still has 4 tokens
    wide = torch.cat([torch.zeros(2, 3, dtype=torch.long), ids], dim=1)
    wide_mask = torch.cat([torch.zeros(2, 3, dtype=torch.long), mask], dim=1)
    assert torch.equal(generate(model, wide, 6, temperature=0, attention_mask=wide_mask)[:, 7:],
                       generate(model, ids, 6, temperature=0, attention_mask=mask)[:, 4:])


def test_bad_masks_and_pad_ids_raise():
    model = _gpt("tiny")
    ids = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"rows \[1\] have a 0 after a 1 \(right padding"):
        generate(model, ids, 2, attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]))
    with pytest.raises(ValueError, match=r"rows \[0\] have a 0 after a 1"):
        generate(model, ids, 2, attention_mask=torch.tensor([[0, 1, 0, 1], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match=r"attention_mask rows \[0\] are all padding"):
        generate(model, ids, 2, attention_mask=torch.tensor([[0, 0, 0, 0], [0, 1, 1, 1]]))
    with pytest.raises(ValueError, match=r"must hold 1 \(token\) and 0 \(padding\) only"):
        generate(model, ids, 2, attention_mask=torch.tensor([[0, 2, 1, 1], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match=r"attention_mask must be a tensor of shape \(batch, prompt_len\)"):
        generate(model, ids, 2, attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"attention_mask must be a tensor"):
        generate(model, ids, 2, attention_mask=[[1, 1, 1, 1]] * 2)
    with pytest.raises(ValueError, match=r"pad_id must be None or an id in \[0, 50\)"):
        generate(model, ids, 2, eos_id=1, pad_id=50)


# ------------------------------------------------------------------ against Hugging Face


@pytest.mark.parametrize("name", ["GPT2", "Llama"])
def test_left_padded_greedy_tokens_equal_hugging_face(name):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "GPT2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                         bos_token_id=None, eos_token_id=None, pad_token_id=0,
                                         tie_word_embeddings=False)
    else:
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                                          bos_token_id=None, eos_token_id=None, pad_token_id=0)
    config._attn_implementation = "eager"
    hf = getattr(transformers, f"{name}LMHeadModel" if name == "GPT2" else f"{name}ForCausalLM")(config)
    hf = hf.eval()  # float32: in float64, transformers' eager Llama gives NaN logits for left-padded rows
    ours = GPT.from_hf(hf).double()
    ids, mask = pad_prompts(PROMPTS, pad_id=0)
    with torch.no_grad():
        expected = hf.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(generate(ours, ids, 10, temperature=0, attention_mask=mask), expected)
