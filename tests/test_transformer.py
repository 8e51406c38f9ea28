"""Tests for companion.models.transformer: equal to torch.nn.Transformer, embeddings, padding, the loss."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from companion.config import ModelConfig
from companion.models.transformer import Transformer, teacher_forcing_loss
from companion.positional import sinusoidal_encoding
from tests.test_blocks import copy_decoder_layer, copy_encoder_layer, perturb_norms


def _model(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.preset("transformer-tiny", **{"vocab_size": 11, "tgt_vocab_size": 13,
                                                                 "d_model": 16, "n_heads": 4, "d_ff": 32, **kw}))


def _torch_reference(ours: Transformer, final_norm: bool) -> nn.Transformer:
    c = ours.config
    d, h, d_ff, n_enc, n_dec = c.d_model, c.n_heads, c.resolved_d_ff, c.n_layers, c.n_decoder_layers
    kwargs = dict(dropout=0.0, batch_first=True)
    if final_norm:
        ref = nn.Transformer(d, h, n_enc, n_dec, d_ff, **kwargs)
    else:  # the paper's post-norm stacks have no extra final LayerNorm
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, h, d_ff, **kwargs), n_enc, enable_nested_tensor=False)
        dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, h, d_ff, **kwargs), n_dec)
        ref = nn.Transformer(d, h, custom_encoder=enc, custom_decoder=dec, **kwargs)
    perturb_norms(ref)
    for o, r in zip(ours.encoder.layers, ref.encoder.layers):
        copy_encoder_layer(o, r)
    for o, r in zip(ours.decoder.layers, ref.decoder.layers):
        copy_decoder_layer(o, r)
    if final_norm:
        ours.encoder.norm.load_state_dict(ref.encoder.norm.state_dict())
        ours.decoder.norm.load_state_dict(ref.decoder.norm.state_dict())
    return ref


@pytest.mark.parametrize("final_norm", [False, True])
def test_post_norm_transformer_equals_torch_with_copied_weights(final_norm):
    ours = _model(n_decoder_layers=3, final_norm=final_norm).eval()
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
    torch.testing.assert_close(ours(src, tgt), expected, atol=1e-4, rtol=1e-4)


def test_embeddings_are_scaled_tied_and_shared():
    shared = _model(tgt_vocab_size=None)
    assert shared.src_embed is shared.tgt_embed and shared.out_proj is None
    ids = torch.tensor([[3, 4]])
    torch.testing.assert_close(shared._embed(shared.src_embed, ids), shared.src_embed(ids) * 4.0)
    assert 0.15 < shared.src_embed.weight.std().item() < 0.35  # N(0, 1/d_model): unit scale after x sqrt(16)
    separate = _model(tgt_vocab_size=7, tie_embeddings=False)
    assert separate.src_embed is not separate.tgt_embed and separate.out_proj is not None
    assert separate(torch.tensor([[3, 4]]), torch.tensor([[1, 5, 6]])).shape == (1, 3, 7)


@pytest.mark.parametrize("kwargs", [dict(norm_position="pre", norm="rmsnorm", ffn="swiglu", position="rope"),
                                    dict(position="alibi", ffn="gelu"), dict(position="learned"),
                                    dict(position="t5", n_kv_heads=2)])
def test_variants_run_and_are_causal(kwargs):
    m = _model(tgt_vocab_size=None, **kwargs).eval()
    src, tgt = torch.randint(3, 10, (2, 6)), torch.randint(3, 10, (2, 5))
    out = m(src, tgt)
    tgt2 = tgt.clone()
    tgt2[:, 3:] = 3
    torch.testing.assert_close(m(src, tgt2)[:, :3], out[:, :3], atol=1e-5, rtol=1e-5)


def test_source_padding_does_not_matter():
    m = _model().eval()
    src, tgt = torch.tensor([[4, 5, 6]]), torch.tensor([[1, 7, 8]])
    torch.testing.assert_close(m(src, tgt), m(torch.tensor([[4, 5, 6, 0, 0]]), tgt), atol=1e-5, rtol=1e-5)


def test_cached_decoding_equals_the_full_decoder():
    m = _model(position="rope", norm_position="pre").eval()
    src, tgt = torch.randint(1, 11, (2, 6)), torch.randint(1, 13, (2, 5))
    with torch.no_grad():
        memory, mask = m.encode(src)
        full = m.decode(tgt, memory, mask)
        cache, cross = m.make_caches(2, max_len=5, src_len=6)
        steps = [m.decode(tgt[:, t : t + 1], memory, mask, cache=cache, cross_cache=cross) for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.seq_len() == 5 and cross.seq_len() == 6


def test_teacher_forcing_loss_ignores_padding_and_shifts():
    m = _model(tgt_vocab_size=None)
    src = torch.tensor([[4, 5, 6], [7, 8, 9]])
    tgt = torch.tensor([[1, 5, 6, 2], [1, 9, 2, 0]])
    logits = m(src, tgt[:, :-1])
    targets = tgt[:, 1:]
    keep = targets != 0
    torch.testing.assert_close(teacher_forcing_loss(m, (src, tgt)), F.cross_entropy(logits[keep], targets[keep]))


def test_errors():
    m = _model()
    with pytest.raises(TypeError, match="config must be a companion ModelConfig"):
        Transformer(11)
    with pytest.raises(ValueError, match="batch sizes differ"):
        m(torch.ones(2, 3, dtype=torch.long), torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"src must lie in \[0, 11\)"):
        m(torch.full((1, 3), 11), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="src must be an integer"):
        m(torch.ones(1, 3), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"memory must have shape \(batch=1"):
        m.decode(torch.ones(1, 3, dtype=torch.long), torch.randn(2, 4, 16))
