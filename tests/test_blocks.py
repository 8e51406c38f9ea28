"""Tests for companion.blocks: one Block for encoders, decoders and GPT, equal to PyTorch's layers."""

import pytest
import torch
from torch import nn

from companion.attention import padding_mask
from companion.blocks import Block, Stack
from companion.config import ModelConfig


def _config(**kw) -> ModelConfig:
    return ModelConfig(**{"vocab_size": 10, "d_model": 16, "n_heads": 4, "d_ff": 40, "position": "none",
                          "norm_position": "post", "ffn": "relu", "init_std": None, **kw})


def _copy_mha(ours, ref):
    ours.in_proj.weight.copy_(ref.in_proj_weight)
    ours.in_proj.bias.copy_(ref.in_proj_bias)
    ours.out_proj.load_state_dict(ref.out_proj.state_dict())


def copy_encoder_layer(ours: Block, ref: nn.TransformerEncoderLayer):
    """Copy a torch encoder layer's weights into a (non-causal, no cross-attention) Block."""
    with torch.no_grad():
        _copy_mha(ours.self_attn, ref.self_attn)
        ours.ffn.w1.load_state_dict(ref.linear1.state_dict())
        ours.ffn.w2.load_state_dict(ref.linear2.state_dict())
        ours.self_norm.load_state_dict(ref.norm1.state_dict())
        ours.ffn_norm.load_state_dict(ref.norm2.state_dict())


def copy_decoder_layer(ours: Block, ref: nn.TransformerDecoderLayer):
    """Copy a torch decoder layer's weights into a Block with cross-attention."""
    with torch.no_grad():
        _copy_mha(ours.self_attn, ref.self_attn)
        _copy_mha(ours.cross_attn, ref.multihead_attn)
        ours.ffn.w1.load_state_dict(ref.linear1.state_dict())
        ours.ffn.w2.load_state_dict(ref.linear2.state_dict())
        ours.self_norm.load_state_dict(ref.norm1.state_dict())
        ours.cross_norm.load_state_dict(ref.norm2.state_dict())
        ours.ffn_norm.load_state_dict(ref.norm3.state_dict())


def perturb_norms(module):
    """Move norm weights away from (1, 0), so that a swapped norm would show."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_equals_torch(norm_first):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(16, 4, 40, dropout=0.0, batch_first=True, norm_first=norm_first)
    perturb_norms(ref)
    ours = Block(_config(norm_position="pre" if norm_first else "post"))
    copy_encoder_layer(ours, ref)
    x = torch.randn(3, 6, 16)
    lengths = torch.tensor([6, 4, 2])
    keep = padding_mask(lengths, 6)
    expected = ref(x, src_key_padding_mask=~keep[:, 0, 0])
    got = ours(x, mask=keep)
    for b, n in enumerate(lengths.tolist()):  # torch's fast path zeroes padded rows; compare real ones
        torch.testing.assert_close(got[b, :n], expected[b, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_equals_torch(norm_first):
    torch.manual_seed(0)
    ref = nn.TransformerDecoderLayer(16, 4, 40, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    perturb_norms(ref)
    ours = Block(_config(norm_position="pre" if norm_first else "post"), cross_attention=True).eval()
    copy_decoder_layer(ours, ref)
    y, z = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    expected = ref(y, z, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5), tgt_is_causal=True)
    torch.testing.assert_close(ours(y, causal=True, memory=z), expected, atol=1e-5, rtol=1e-5)


def test_causal_block_ignores_the_future():
    block = Block(_config()).eval()
    x = torch.randn(2, 6, 16)
    changed = x.clone()
    changed[:, 4:] += 1.0
    torch.testing.assert_close(block(changed, causal=True)[:, :4], block(x, causal=True)[:, :4])
    assert not torch.allclose(block(changed)[:, :4], block(x)[:, :4])  # a non-causal block sees it


def test_padding_is_ignored_by_an_encoder_stack():
    stack = Stack(_config(), 2, causal=False).eval()
    x = torch.randn(1, 3, 16)
    padded = torch.cat([x, 100 * torch.randn(1, 2, 16)], 1)
    torch.testing.assert_close(stack(padded, mask=padding_mask([3], 5))[:, :3], stack(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", ["rope", "alibi", "t5"])
def test_relative_positions_break_permutation_symmetry(position):
    stack = Stack(_config(position=position), 1, causal=False).eval()
    x = torch.randn(1, 6, 16)
    perm = torch.tensor([3, 1, 5, 0, 2, 4])
    assert not torch.allclose(stack(x[:, perm]), stack(x)[:, perm], atol=1e-4)
    none = Stack(_config(), 1, causal=False).eval()  # no positions: shuffled in, shuffled out
    torch.testing.assert_close(none(x[:, perm]), none(x)[:, perm], atol=1e-5, rtol=1e-5)


def test_final_norm_defaults_and_choices():
    assert Stack(_config(norm_position="pre"), 1, causal=False).norm is not None
    assert Stack(_config(norm_position="post"), 1, causal=False).norm is None
    assert Stack(_config(norm_position="post", final_norm=True), 1, causal=False).norm is not None


def test_no_residual_changes_the_output_and_is_the_bare_sublayers():
    torch.manual_seed(0)
    plain, bare = Block(_config(norm_position="pre")), Block(_config(norm_position="pre", residual=False))
    bare.load_state_dict(plain.state_dict())
    x = torch.randn(1, 4, 16)
    h = bare.self_attn(bare.self_norm(x))[0]
    torch.testing.assert_close(bare(x), bare.ffn(bare.ffn_norm(h)))
    assert not torch.allclose(plain(x), bare(x))


def test_attention_weights_are_kept_on_request():
    stack = Stack(_config(), 2, causal=True, cross_attention=True)
    stack(torch.randn(2, 3, 16), memory=torch.randn(2, 5, 16), need_weights=True)
    assert [w.shape for w in stack.attention_weights("cross")] == [(2, 4, 3, 5)] * 2
    assert [w.shape for w in stack.attention_weights("self")] == [(2, 4, 3, 3)] * 2
    with pytest.raises(ValueError, match="kind must be 'self' or 'cross'"):
        stack.attention_weights("both")


def test_cross_attention_needs_memory():
    with pytest.raises(ValueError, match="pass memory="):
        Block(_config(), cross_attention=True)(torch.randn(1, 2, 16))
