import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.models.transformer import (
    Transformer,
    beam_search,
    greedy_decode,
    length_penalty,
    teacher_forcing_loss,
)
from companion.positional import sinusoidal_encoding
from tests.test_blocks import _copy_decoder_layer, _copy_encoder_layer, _perturb_norms


def _torch_reference(ours: Transformer, final_norm: bool) -> nn.Transformer:
    d, h = ours.d_model, ours.encoder.n_heads
    d_ff = ours.encoder.layers[0].ffn.d_ff
    n_enc, n_dec = len(ours.encoder.layers), len(ours.decoder.layers)
    kwargs = dict(dropout=0.0, batch_first=True)
    if final_norm:
        ref = nn.Transformer(d, h, n_enc, n_dec, d_ff, **kwargs)
    else:  # the paper's post-norm stacks have no extra final LayerNorm
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, h, d_ff, **kwargs), n_enc, enable_nested_tensor=False)
        dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, h, d_ff, **kwargs), n_dec)
        ref = nn.Transformer(d, h, custom_encoder=enc, custom_decoder=dec, **kwargs)
    _perturb_norms(ref)
    for o, r in zip(ours.encoder.layers, ref.encoder.layers):
        _copy_encoder_layer(o, r)
    for o, r in zip(ours.decoder.layers, ref.decoder.layers):
        _copy_decoder_layer(o, r)
    if final_norm:
        ours.encoder.norm.load_state_dict(ref.encoder.norm.state_dict())
        ours.decoder.norm.load_state_dict(ref.decoder.norm.state_dict())
    return ref


@pytest.mark.parametrize("final_norm", [False, True])
def test_post_norm_transformer_equals_torch_with_copied_weights(final_norm):
    torch.manual_seed(0)
    ours = Transformer(11, 13, d_model=16, n_heads=4, n_encoder_layers=2, n_decoder_layers=3, d_ff=32, dropout=0.0,
                       final_norm=final_norm).eval()
    ref = _torch_reference(ours, final_norm).eval()
    src = torch.tensor([[5, 6, 7, 8, 9], [3, 4, 10, 0, 0]])
    tgt = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 12]])
    pe = sinusoidal_encoding(8, 16)
    src_x = ours.src_embed(src) * math.sqrt(16) + pe[:5]
    tgt_x = ours.tgt_embed(tgt) * math.sqrt(16) + pe[:4]
    pad = src == 0
    h = ref(src_x, tgt_x, tgt_mask=nn.Transformer.generate_square_subsequent_mask(4), tgt_is_causal=True,
            src_key_padding_mask=pad, memory_key_padding_mask=pad)
    expected = h @ ours.tgt_embed.weight.T  # tied output projection
    assert torch.allclose(ours(src, tgt), expected, atol=1e-4)


def test_embeddings_are_scaled_tied_and_shared():
    m = Transformer(9, 9, d_model=8, n_heads=2, share_embeddings=True, dropout=0.0)
    assert m.src_embed is m.tgt_embed and m.out_proj is None
    ids = torch.tensor([[3, 4]])
    assert torch.allclose(m._embed(m.src_embed, ids), m.src_embed(ids) * math.sqrt(8) + sinusoidal_encoding(2, 8))
    separate = Transformer(9, 7, d_model=8, n_heads=2, tie_output=False)
    assert separate.src_embed is not separate.tgt_embed and separate.out_proj is not None
    assert separate(torch.tensor([[3, 4]]), torch.tensor([[1, 5, 6]])).shape == (1, 3, 7)


@pytest.mark.parametrize("kwargs", [dict(norm_position="pre", norm="rmsnorm", ffn="swiglu", position="rope"),
                                    dict(position="alibi", ffn="gelu"), dict(position="learned")])
def test_variants_run_and_are_causal(kwargs):
    torch.manual_seed(0)
    m = Transformer(10, 10, d_model=16, n_heads=2, dropout=0.0, **kwargs).eval()
    src, tgt = torch.randint(3, 10, (2, 6)), torch.randint(3, 10, (2, 5))
    out = m(src, tgt)
    tgt2 = tgt.clone()
    tgt2[:, 3:] = 3
    assert torch.allclose(m(src, tgt2)[:, :3], out[:, :3], atol=1e-5)


def test_source_padding_does_not_matter():
    torch.manual_seed(0)
    m = Transformer(10, 10, d_model=16, n_heads=2, dropout=0.0).eval()
    src = torch.tensor([[4, 5, 6]])
    tgt = torch.tensor([[1, 7, 8]])
    padded = torch.tensor([[4, 5, 6, 0, 0]])
    assert torch.allclose(m(src, tgt), m(padded, tgt), atol=1e-5)


def test_teacher_forcing_loss_ignores_padding_and_shifts():
    torch.manual_seed(0)
    m = Transformer(10, 10, d_model=16, n_heads=2, dropout=0.0)
    src = torch.tensor([[4, 5, 6], [7, 8, 9]])
    tgt = torch.tensor([[1, 5, 6, 2], [1, 9, 2, 0]])
    logits = m(src, tgt[:, :-1])
    targets = tgt[:, 1:]
    keep = targets != 0
    manual = F.cross_entropy(logits[keep], targets[keep])
    assert torch.allclose(teacher_forcing_loss(m, (src, tgt)), manual, atol=1e-6)


def _memorise(task_pairs, steps=150):
    """A tiny model trained to map each of a few sources to a fixed target."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small only loses from threads (contention on a busy machine)
    try:
        return _train(task_pairs, steps)
    finally:
        torch.set_num_threads(threads)


def _train(task_pairs, steps):
    torch.manual_seed(0)
    m = Transformer(8, 8, d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.0)
    src = torch.tensor([s for s, _ in task_pairs])
    tgt = torch.tensor([t for _, t in task_pairs])
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = teacher_forcing_loss(m, (src, tgt))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m, src, tgt


def test_greedy_and_beam_recover_memorised_targets():
    pairs = [([3, 4, 5], [1, 5, 4, 3, 2]), ([6, 7, 3], [1, 3, 7, 6, 2]), ([4, 4, 6], [1, 6, 4, 4, 2])]
    m, src, tgt = _memorise(pairs)
    assert torch.equal(greedy_decode(m, src, 1, 2, max_len=8), tgt)
    assert torch.equal(beam_search(m, src, 1, 2, beam_size=3, max_len=8), tgt)
    assert m.training  # restored


def test_beam_search_with_beam_one_is_greedy_and_scores_are_consistent():
    torch.manual_seed(1)
    m = Transformer(8, 8, d_model=16, n_heads=2, dropout=0.0)
    src = torch.randint(3, 8, (3, 4))
    greedy = greedy_decode(m, src, 1, 2, max_len=6)
    beam1 = beam_search(m, src, 1, 2, beam_size=1, max_len=6, alpha=0.0)
    assert torch.equal(beam1[:, : greedy.shape[1]], greedy[:, : beam1.shape[1]])
    # the returned score is the sequence's own log-probability (alpha = 0: no length normalisation)
    out, scores = beam_search(m, src[:1], 1, 2, beam_size=4, max_len=6, alpha=0.0, return_scores=True)
    seq = out[0][out[0] != 0] if (out[0] == 2).any() else out[0]
    logp = m.eval()(src[:1], seq[None, :-1]).log_softmax(-1)
    total = logp[0, torch.arange(len(seq) - 1), seq[1:]].sum()
    assert torch.allclose(total, scores[0], atol=1e-4)
    # a wider beam never finds a worse sequence than greedy under the same scoring
    g = greedy_decode(m, src[:1], 1, 2, max_len=6)[0]
    g = g[g != 0]
    g_logp = m(src[:1], g[None, :-1]).log_softmax(-1)[0, torch.arange(len(g) - 1), g[1:]].sum()
    assert scores[0] >= g_logp - 1e-4


def test_length_penalty():
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 1.0) == pytest.approx(2.0)


def test_errors():
    with pytest.raises(ValueError, match="share_embeddings"):
        Transformer(10, 12, share_embeddings=True)
    with pytest.raises(ValueError, match="divisible"):
        Transformer(10, 10, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="even"):  # sinusoidal positions come in (sin, cos) pairs
        Transformer(10, 10, d_model=15, n_heads=3)
    with pytest.raises(ValueError, match="d_ff"):
        Transformer(10, 10, d_ff=0)
    with pytest.raises(ValueError, match="src_vocab_size"):
        Transformer(1, 10)
    with pytest.raises(ValueError, match="norm_position"):
        Transformer(10, 10, norm_position="sandwich")
    with pytest.raises(ValueError, match="ffn"):
        Transformer(10, 10, ffn="tanh")
    with pytest.raises(ValueError, match="position"):
        Transformer(10, 10, position="t5")
    m = Transformer(10, 10, d_model=16, n_heads=2)
    with pytest.raises(ValueError, match="batch sizes differ"):
        m(torch.ones(2, 3, dtype=torch.long), torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="src ids"):
        m(torch.full((1, 3), 10), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="src must be an integer"):
        m(torch.ones(1, 3), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(m, torch.ones(1, 3, dtype=torch.long), 1, 2, beam_size=0)
    with pytest.raises(ValueError, match="eos_id"):
        greedy_decode(m, torch.ones(1, 3, dtype=torch.long), 1, 99)
    with pytest.raises(TypeError, match="Transformer"):
        greedy_decode(torch.nn.Linear(2, 2), torch.ones(1, 3, dtype=torch.long), 1, 2)
