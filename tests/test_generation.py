"""Tests for companion.generation: the sampling distribution, cached = uncached, greedy and beam search."""

import pytest
import torch

from companion.config import ModelConfig
from companion.generation import beam_search, generate, greedy_decode, length_penalty, sampling_probs
from companion.models.gpt import GPT
from companion.models.transformer import Transformer, teacher_forcing_loss


def _gpt(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig.preset("tiny", **{"vocab_size": 50, "max_len": 64, **kw}))


# ------------------------------------------------------------------ sampling_probs


def test_sampling_probs_identities():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(0))
    plain = logits.softmax(-1)
    torch.testing.assert_close(sampling_probs(logits), plain)
    torch.testing.assert_close(sampling_probs(logits, top_p=1.0), plain)  # top_p = 1: plain sampling
    greedy = torch.nn.functional.one_hot(logits.argmax(-1), 20).float()
    assert torch.equal(sampling_probs(logits, temperature=0), greedy)
    assert torch.equal(sampling_probs(logits, top_k=1), greedy)  # top_k = 1: greedy
    torch.testing.assert_close(sampling_probs(logits, temperature=2.0), (logits / 2).softmax(-1))


def test_top_k_and_top_p_keep_the_right_tokens():
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    logits = probs.log()
    k2 = sampling_probs(logits, top_k=2)
    torch.testing.assert_close(k2, torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7)
    # nucleus: the smallest set of most probable tokens whose mass reaches p
    torch.testing.assert_close(sampling_probs(logits, top_p=0.6), torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7)
    torch.testing.assert_close(sampling_probs(logits, top_p=0.5), torch.tensor([1.0, 0, 0, 0, 0]))
    torch.testing.assert_close(sampling_probs(logits, top_p=0.86), torch.tensor([0.5, 0.2, 0.15, 0.1, 0]) / 0.95)
    # applied in order: temperature, then top-k, then top-p; shuffled vocabularies work the same
    perm = torch.tensor([3, 0, 4, 1, 2])
    torch.testing.assert_close(sampling_probs(logits[perm], top_p=0.6), sampling_probs(logits, top_p=0.6)[perm])


def test_top_k_keeps_ties_at_the_boundary_as_hugging_face_does():
    # a tie with the k-th largest logit keeps every tied token, so top_k = 1 is greedy only without a tie
    logits = torch.tensor([[2.0, 1.0, 2.0, 0.5, 1.0, -1.0]])
    torch.testing.assert_close(sampling_probs(logits, top_k=1), torch.tensor([[0.5, 0, 0.5, 0, 0, 0]]))
    three = sampling_probs(logits, top_k=3)  # the 3rd largest, 1.0, ties with another: four tokens kept
    assert (three > 0).tolist() == [[True, True, True, False, True, False]]
    assert torch.equal(sampling_probs(logits, temperature=0), torch.tensor([[1.0, 0, 0, 0, 0, 0]]))  # lowest id
    transformers = pytest.importorskip("transformers")
    for k in (1, 2, 3, 5):
        warped = transformers.TopKLogitsWarper(top_k=k)(None, logits.clone())
        torch.testing.assert_close(sampling_probs(logits, top_k=k), warped.softmax(-1))


def test_sampling_probs_bad_arguments():
    logits = torch.randn(4)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        sampling_probs(logits, temperature=-1)
    with pytest.raises(ValueError, match="top_k must be an int >= 1"):
        sampling_probs(logits, top_k=0)
    with pytest.raises(ValueError, match=r"top_p must be None or a number in \(0, 1\]"):
        sampling_probs(logits, top_p=0)
    with pytest.raises(TypeError, match="logits must be a floating-point tensor"):
        sampling_probs(torch.ones(4, dtype=torch.long))


# ------------------------------------------------------------------ decoder-only generation


@pytest.mark.parametrize("position", ["learned", "rope", "alibi", "t5"])
def test_cached_and_uncached_generation_give_the_same_tokens(position):
    model = _gpt(position=position)
    prompt = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(1))
    greedy = generate(model, prompt, 30, temperature=0)
    assert torch.equal(greedy, generate(model, prompt, 30, temperature=0, use_cache=False))
    sampled = [generate(model, prompt, 30, top_k=10, top_p=0.9, generator=torch.Generator().manual_seed(7),
                        use_cache=use) for use in (True, False)]
    assert torch.equal(*sampled)
    assert greedy.shape == (2, 36) and torch.equal(greedy[:, :6], prompt)


@pytest.mark.parametrize("position", ["rope", "sinusoidal", "alibi", "t5"])
def test_generation_past_max_len_continues_as_the_forward_pass_does(position):
    # schemes that give every position a value extrapolate past max_len; a learned table refuses
    model = _gpt(position=position, max_len=8).eval()
    prompt = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(2))
    out = generate(model, prompt, 12, temperature=0)  # 17 tokens, more than max_len = 8
    assert out.shape == (2, 17) and torch.equal(out, generate(model, prompt, 12, temperature=0, use_cache=False))
    with torch.no_grad():
        assert torch.equal(model(out[:, :-1])[:, 4:].argmax(-1), out[:, 5:])  # each new token: the full pass's argmax
    with pytest.raises(ValueError, match="max_len=8 learned positions"):
        generate(_gpt(position="learned", max_len=8), prompt, 12)


def test_greedy_takes_the_argmax_of_the_model():
    model = _gpt()
    prompt = torch.randint(0, 50, (1, 4))
    out = generate(model, prompt, 3, temperature=0)
    for t in range(4, 7):
        assert out[0, t] == model(out[:, :t])[0, -1].argmax()
    assert torch.equal(out, generate(model, prompt, 3, top_k=1))  # top_k = 1 is greedy


def test_sampling_follows_the_distribution():
    model = _gpt(n_layers=1)
    prompt = torch.zeros(4000, 1, dtype=torch.long)
    out = generate(model, prompt, 1, temperature=1.5, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(out[:, 1], minlength=50).float() / 4000
    expected = sampling_probs(model(prompt[:1])[0, -1], temperature=1.5)
    assert (counts - expected).abs().max() < 0.03


def test_eos_finishes_a_sequence_and_generation_stops():
    model = _gpt()
    prompt = torch.randint(0, 50, (3, 4))
    free = generate(model, prompt, 8, temperature=0)
    eos = int(free[0, 5])  # the first row emits it at its 2nd new token
    out = generate(model, prompt, 8, temperature=0, eos_id=eos)
    assert (out[0, 5:] == eos).all()
    assert out.shape[1] <= free.shape[1]
    assert model.training  # restored after generation


def test_generate_bad_arguments():
    model = _gpt(max_len=8)
    prompt = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="exceeds the model's max_len=8"):
        generate(model, prompt, 5)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        generate(model, prompt, 0)
    with pytest.raises(TypeError, match="model must be a companion GPT"):
        generate(torch.nn.Linear(2, 2), prompt, 1)
    with pytest.raises(ValueError, match="ids must lie in"):
        generate(model, torch.full((1, 2), 50), 1)


# ------------------------------------------------------------------ encoder-decoder decoding


def _seq2seq(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.preset("transformer-tiny", **{"vocab_size": 8, "d_model": 32, "n_heads": 2,
                                                                 "n_layers": 1, "n_decoder_layers": 1, "d_ff": 64,
                                                                 **kw}))


def _memorise(pairs, steps=150):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small only loses from threads
    try:
        m = _seq2seq()
        src, tgt = torch.tensor([s for s, _ in pairs]), torch.tensor([t for _, t in pairs])
        opt = torch.optim.Adam(m.parameters(), lr=3e-3)
        for _ in range(steps):
            loss = teacher_forcing_loss(m, (src, tgt))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return m, src, tgt
    finally:
        torch.set_num_threads(threads)


def test_greedy_and_beam_recover_memorised_targets():
    pairs = [([3, 4, 5], [1, 5, 4, 3, 2]), ([6, 7, 3], [1, 3, 7, 6, 2]), ([4, 4, 6], [1, 6, 4, 4, 2])]
    m, src, tgt = _memorise(pairs)
    assert torch.equal(greedy_decode(m, src, 1, 2, max_len=8), tgt)
    assert torch.equal(beam_search(m, src, 1, 2, beam_size=3, max_len=8), tgt)
    assert m.training  # restored


@pytest.mark.parametrize("position", ["sinusoidal", "rope"])
def test_cached_and_uncached_seq2seq_decoding_agree(position):
    m = _seq2seq(position=position, n_layers=2, n_decoder_layers=2)
    src = torch.randint(3, 8, (4, 5), generator=torch.Generator().manual_seed(2))
    assert torch.equal(greedy_decode(m, src, 1, 2, 10), greedy_decode(m, src, 1, 2, 10, use_cache=False))
    a, sa = beam_search(m, src, 1, 2, beam_size=3, max_len=10, return_scores=True)
    b, sb = beam_search(m, src, 1, 2, beam_size=3, max_len=10, return_scores=True, use_cache=False)
    assert torch.equal(a, b)
    torch.testing.assert_close(sa, sb, atol=1e-5, rtol=1e-5)


def test_beam_search_with_beam_one_is_greedy_and_scores_are_consistent():
    m = _seq2seq().eval()
    src = torch.randint(3, 8, (3, 4), generator=torch.Generator().manual_seed(1))
    greedy = greedy_decode(m, src, 1, 2, max_len=6)
    beam1 = beam_search(m, src, 1, 2, beam_size=1, max_len=6, alpha=0.0)
    assert torch.equal(beam1[:, : greedy.shape[1]], greedy[:, : beam1.shape[1]])
    # the returned score is the sequence's own log-probability (alpha = 0: no length normalisation)
    out, scores = beam_search(m, src[:1], 1, 2, beam_size=4, max_len=6, alpha=0.0, return_scores=True)
    seq = out[0][out[0] != 0] if (out[0] == 2).any() else out[0]
    with torch.no_grad():
        logp = m(src[:1], seq[None, :-1]).log_softmax(-1)
        total = logp[0, torch.arange(len(seq) - 1), seq[1:]].sum()
        torch.testing.assert_close(total, scores[0], atol=1e-4, rtol=1e-4)
        # a wider beam never finds a worse sequence than greedy under the same scoring
        g = greedy_decode(m, src[:1], 1, 2, max_len=6)[0]
        g = g[g != 0]
        g_logp = m(src[:1], g[None, :-1]).log_softmax(-1)[0, torch.arange(len(g) - 1), g[1:]].sum()
    assert scores[0] >= g_logp - 1e-4


@pytest.mark.parametrize("alpha", [0.0, 0.6, 3.0])
def test_beam_search_without_early_stopping_finds_the_exhaustive_best(alpha):
    """A beam as wide as every hypothesis, searched on while one could win, returns what brute force returns."""
    import itertools

    from companion.generation import length_penalty

    m = _seq2seq(tgt_vocab_size=4).eval()  # target ids 0..3: 0 pad, 1 <bos>, 2 <eos>; any may be emitted
    decode = m.decode  # <eos> made likely, so that short hypotheses finish first (forward uses decode too)
    m.decode = lambda *args, **kw: decode(*args, **kw) + torch.tensor([0.0, 0.0, 2.0, 0.0])
    src = torch.randint(3, 8, (4, 4), generator=torch.Generator().manual_seed(3))
    max_len, gained = 4, []
    for row in range(len(src)):
        best = -float("inf")
        with torch.no_grad():
            for length in range(1, max_len + 1):
                for seq in itertools.product(range(4), repeat=length):
                    if 2 in seq[:-1]:
                        continue  # <eos> ends a hypothesis
                    ids = torch.tensor([[1, *seq]])
                    logp = m(src[row:row + 1], ids[:, :-1]).log_softmax(-1)[0, torch.arange(length), ids[0, 1:]].sum()
                    if seq[-1] == 2 or length == max_len:
                        best = max(best, logp.item() / length_penalty(length, alpha))
        _, score = beam_search(m, src[row:row + 1], 1, 2, beam_size=64, max_len=max_len, alpha=alpha,
                               return_scores=True, early_stopping=False)
        assert score.item() == pytest.approx(best, abs=1e-4)
        _, early = beam_search(m, src[row:row + 1], 1, 2, beam_size=8, max_len=max_len, alpha=alpha,
                               return_scores=True, early_stopping=True)
        _, patient = beam_search(m, src[row:row + 1], 1, 2, beam_size=8, max_len=max_len, alpha=alpha,
                                 return_scores=True)
        assert patient.item() >= early.item() - 1e-6  # searching on never returns a worse score
        gained.append(patient.item() > early.item() + 1e-6)
        for beam_size in (1, 2, 8):  # what is returned is a whole hypothesis, scored as it is
            out, got = beam_search(m, src[row:row + 1], 1, 2, beam_size=beam_size, max_len=max_len, alpha=alpha,
                                   return_scores=True)
            seq = out[0].tolist()
            seq = seq[: seq.index(2) + 1] if 2 in seq[1:] else seq
            assert seq[-1] == 2 or len(seq) == max_len + 1, seq  # ends with <eos>, or ran out of length
            with torch.no_grad():
                ids = torch.tensor([seq])
                logp = m(src[row:row + 1], ids[:, :-1]).log_softmax(-1)[0, torch.arange(len(seq) - 1), ids[0, 1:]].sum()
            assert got.item() == pytest.approx(logp.item() / length_penalty(len(seq) - 1, alpha), abs=1e-4)
    if alpha > 0:  # the normaliser rewards length: stopping at 8 finished misses longer winners
        assert any(gained)


def test_greedy_without_an_end_token_runs_every_step():
    m = _seq2seq()
    src = torch.randint(3, 8, (2, 4))
    assert greedy_decode(m, src, 1, None, max_len=7).shape == (2, 8)
    assert beam_search(m, src, 1, None, max_len=7).shape == (2, 8)  # every beam runs to the end


def test_length_penalty():
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 1.0) == pytest.approx(2.0)


def test_seq2seq_bad_arguments():
    m = _seq2seq()
    src = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="beam_size must be an int >= 1"):
        beam_search(m, src, 1, 2, beam_size=0)
    with pytest.raises(ValueError, match=r"bos_id must be a target id in \[0, 8\)"):
        greedy_decode(m, src, 9, 2)
    with pytest.raises(TypeError, match="model must be a companion Transformer"):
        greedy_decode(_gpt(), src, 1, 2)


# ------------------------------------------------------------------ inference mode


def test_decoders_return_ordinary_tensors_that_training_can_use():
    """The decoders run in ``torch.inference_mode``; nothing made there may leak into training."""
    model = _gpt()
    out = generate(model, torch.randint(0, 50, (2, 4)), 5, temperature=0)
    assert not out.is_inference()
    model(out[:, :-1]).logsumexp(-1).mean().backward()  # ids feed the embedding, which saves them for backward

    m = _seq2seq(max_len=4)  # sinusoidal positions: decoding 12 tokens grows the table while in inference mode
    src = torch.randint(3, 8, (2, 3), generator=torch.Generator().manual_seed(0))
    greedy = greedy_decode(m, src, 1, None, max_len=12)
    beams = beam_search(m, src, 1, None, beam_size=2, max_len=12)
    assert not greedy.is_inference() and not beams.is_inference()
    assert not any(b.is_inference() for b in m.buffers())
    teacher_forcing_loss(m, (src, greedy)).backward()


def test_a_sliding_window_gpt_generates_through_a_rolling_cache(monkeypatch):
    from companion.attention import RollingKVCache

    torch.manual_seed(0)
    model = GPT(ModelConfig.preset("llama-tiny", sliding_window=5)).eval()
    made = []
    make_cache = model.make_cache
    monkeypatch.setattr(model, "make_cache", lambda *a, **k: made.append(make_cache(*a, **k)) or made[-1])
    prompt = torch.randint(256, (2, 7))  # longer than the window, and 30 new tokens more
    cached = generate(model, prompt, 30, temperature=0)
    assert isinstance(made[-1], RollingKVCache) and made[-1].stored() == 5  # memory O(window)
    torch.testing.assert_close(cached, generate(model, prompt, 30, temperature=0, use_cache=False), rtol=0, atol=0)
    sampled = [generate(model, prompt, 30, generator=torch.Generator().manual_seed(1), use_cache=c)
               for c in (True, False)]
    assert torch.equal(*sampled)
