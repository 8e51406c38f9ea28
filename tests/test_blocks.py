import pytest
import torch
from torch import nn

from companion.attention import padding_mask
from companion.blocks import DecoderLayer, EncoderLayer, TransformerDecoder, TransformerEncoder
from companion.normalization import RMSNorm


def _copy_mha(ours, ref):
    ours.in_proj.weight.copy_(ref.in_proj_weight)
    ours.in_proj.bias.copy_(ref.in_proj_bias)
    ours.out_proj.load_state_dict(ref.out_proj.state_dict())


def _copy_encoder_layer(ours: EncoderLayer, ref: nn.TransformerEncoderLayer):
    with torch.no_grad():
        _copy_mha(ours.self_attn, ref.self_attn)
        ours.ffn.w1.load_state_dict(ref.linear1.state_dict())
        ours.ffn.w2.load_state_dict(ref.linear2.state_dict())
        ours.attn_block.norm.load_state_dict(ref.norm1.state_dict())
        ours.ffn_block.norm.load_state_dict(ref.norm2.state_dict())


def _copy_decoder_layer(ours: DecoderLayer, ref: nn.TransformerDecoderLayer):
    with torch.no_grad():
        _copy_mha(ours.self_attn, ref.self_attn)
        _copy_mha(ours.cross_attn, ref.multihead_attn)
        ours.ffn.w1.load_state_dict(ref.linear1.state_dict())
        ours.ffn.w2.load_state_dict(ref.linear2.state_dict())
        ours.self_block.norm.load_state_dict(ref.norm1.state_dict())
        ours.cross_block.norm.load_state_dict(ref.norm2.state_dict())
        ours.ffn_block.norm.load_state_dict(ref.norm3.state_dict())


def _perturb_norms(module):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_torch(norm_first):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(16, 4, 40, dropout=0.0, batch_first=True, norm_first=norm_first)
    _perturb_norms(ref)
    ours = EncoderLayer(16, 4, 40, norm_position="pre" if norm_first else "post")
    _copy_encoder_layer(ours, ref)
    x = torch.randn(3, 6, 16)
    lengths = torch.tensor([6, 4, 2])
    keep = padding_mask(lengths, 6)
    expected = ref(x, src_key_padding_mask=~keep[:, 0, 0])
    got = ours(x, mask=keep)
    for b, n in enumerate(lengths.tolist()):  # torch's fast path zeroes padded rows; compare real ones
        assert torch.allclose(got[b, :n], expected[b, :n], atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_torch(norm_first):
    torch.manual_seed(0)
    ref = nn.TransformerDecoderLayer(16, 2, 24, dropout=0.0, batch_first=True, norm_first=norm_first)
    _perturb_norms(ref)
    ours = DecoderLayer(16, 2, 24, norm_position="pre" if norm_first else "post")
    _copy_decoder_layer(ours, ref)
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    keep = padding_mask([7, 3], 7)
    expected = ref(x, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5), tgt_is_causal=True,
                   memory_key_padding_mask=~keep[:, 0, 0])
    assert torch.allclose(ours(x, memory, memory_mask=keep), expected, atol=1e-5)


def test_decoder_is_causal():
    torch.manual_seed(0)
    dec = TransformerDecoder(2, 16, 4, 32, norm_position="pre", ffn="swiglu", norm="rmsnorm").eval()
    x, memory = torch.randn(1, 6, 16), torch.randn(1, 4, 16)
    out = dec(x, memory)
    x2 = x.clone()
    x2[:, 4:] += 5.0  # change the future
    out2 = dec(x2, memory)
    assert torch.allclose(out[:, :4], out2[:, :4], atol=1e-5)
    assert not torch.allclose(out[:, 4:], out2[:, 4:], atol=1e-3)


def test_encoder_padding_is_ignored():
    torch.manual_seed(0)
    enc = TransformerEncoder(2, 16, 4, 32).eval()
    x = torch.randn(1, 5, 16)
    keep = padding_mask([3], 5)
    junk = x.clone()
    junk[:, 3:] = torch.randn(1, 2, 16) * 10
    assert torch.allclose(enc(x, keep)[:, :3], enc(junk, keep)[:, :3], atol=1e-5)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_relative_positions_break_permutation_symmetry(position):
    torch.manual_seed(0)
    x = torch.randn(1, 6, 16)
    perm = torch.tensor([5, 3, 1, 0, 2, 4])
    plain = TransformerEncoder(1, 16, 4, 32, position="none").eval()
    assert torch.allclose(plain(x[:, perm]), plain(x)[:, perm], atol=1e-5)  # attention alone is equivariant
    enc = TransformerEncoder(1, 16, 4, 32, position=position).eval()
    assert not torch.allclose(enc(x[:, perm]), enc(x)[:, perm], atol=1e-3)


def test_final_norm_defaults_and_choices():
    assert TransformerEncoder(2, 8, 2, 16, norm_position="pre").norm is not None
    assert TransformerEncoder(2, 8, 2, 16, norm_position="post").norm is None
    enc = TransformerEncoder(2, 8, 2, 16, norm_position="pre", norm="rmsnorm")
    assert isinstance(enc.norm, RMSNorm) and isinstance(enc.layers[0].attn_block.norm, RMSNorm)


def test_no_residual_changes_the_output():
    torch.manual_seed(0)
    a = EncoderLayer(8, 2, 16, residual=True)
    b = EncoderLayer(8, 2, 16, residual=False)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 8)
    y = a.self_attn(x)[0]
    assert torch.allclose(b.attn_block(x, lambda h: a.self_attn(h)[0]), b.attn_block.norm(y), atol=1e-6)
    assert not torch.allclose(a(x), b(x), atol=1e-3)


def test_cross_attention_weights_are_kept():
    dec = TransformerDecoder(2, 8, 2, 16)
    dec(torch.randn(3, 4, 8), torch.randn(3, 5, 8), need_weights=True)
    w = dec.cross_attention_weights()
    assert len(w) == 2 and w[0].shape == (3, 2, 4, 5)
    assert torch.allclose(w[1].sum(-1), torch.ones(3, 2, 4), atol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match="norm_position"):
        EncoderLayer(8, 2, 16, norm_position="middle")
    with pytest.raises(ValueError, match="norm"):
        DecoderLayer(8, 2, 16, norm="batchnorm")
    with pytest.raises(ValueError, match="ffn"):
        EncoderLayer(8, 2, 16, ffn="tanh")
    with pytest.raises(ValueError, match="d_ff"):
        EncoderLayer(8, 2, 0)
    with pytest.raises(ValueError, match="n_layers"):
        TransformerEncoder(0, 8, 2, 16)
    with pytest.raises(ValueError, match="position"):
        TransformerDecoder(1, 8, 2, 16, position="sinusoidal")
    with pytest.raises(ValueError, match="divisible"):
        TransformerEncoder(1, 10, 4, 16)
    with pytest.raises(ValueError, match="d_model=8"):
        TransformerEncoder(1, 8, 2, 16)(torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match="batch size"):
        TransformerDecoder(1, 8, 2, 16)(torch.randn(2, 3, 8), torch.randn(3, 4, 8))
    with pytest.raises(ValueError, match="batch size"):
        DecoderLayer(8, 2, 16)(torch.randn(2, 3, 8), torch.randn(3, 4, 8))
