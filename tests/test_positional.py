"""Tests for companion.positional: known values, the properties each scheme promises, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from companion.attention import KVCache, MultiHeadAttention, scaled_dot_product_attention
from companion.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    T5RelativePositionBias,
    alibi_bias,
    alibi_slopes,
    rotary_permutation,
    sinusoidal_encoding,
    t5_relative_position_bucket,
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --------------------------------------------------------------------------------------------
# Sinusoidal encodings
# --------------------------------------------------------------------------------------------


def test_sinusoidal_matches_the_formula_of_the_paper():
    max_len, d = 50, 12
    pe = sinusoidal_encoding(max_len, d)
    assert pe.shape == (max_len, d) and pe.dtype == torch.get_default_dtype()
    for pos in range(max_len):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_first_rows_by_hand():
    pe = sinusoidal_encoding(2, 4)
    # position 0: sin 0 = 0, cos 0 = 1; position 1, pair 0: (sin 1, cos 1); pair 1: ω = 1/100
    expected = torch.tensor([[0.0, 1.0, 0.0, 1.0], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]])
    torch.testing.assert_close(pe, expected)


def _rotation_blocks(k: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """Block-diagonal R_k with R_k @ (sin ωp, cos ωp) = (sin ω(p+k), cos ω(p+k)) in every pair."""
    r = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        w = k / base ** (2 * i / d)
        c, s = math.cos(w), math.sin(w)
        r[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    return r


@pytest.mark.parametrize("k", [1, 3, 17, 100])
def test_sinusoidal_shift_is_a_rotation_that_depends_only_on_the_offset(k):
    d = 16
    pe = sinusoidal_encoding(600, d).double()
    # PE[pos + k] = R_k PE[pos] at every position, with the analytic block rotation R_k.
    torch.testing.assert_close(pe[: 600 - k] @ _rotation_blocks(k, d).T, pe[k:], atol=1e-6, rtol=0)


@pytest.mark.parametrize("k", [1, 7, 40])
def test_sinusoidal_shift_map_fitted_anywhere_is_the_same(k):
    # Fit the linear map PE[pos] -> PE[pos + k] by least squares on positions 0..199 and, separately,
    # on 300..499: both fits are the same matrix, R_k. (base 100 so that even the slowest pair turns
    # far enough within 200 positions for the fit to be well conditioned.)
    d, base = 16, 100.0
    pe = sinusoidal_encoding(600, d, base=base).double()
    early = torch.linalg.lstsq(pe[:200], pe[k : 200 + k]).solution.T
    late = torch.linalg.lstsq(pe[300:500], pe[300 + k : 500 + k]).solution.T
    torch.testing.assert_close(early, late, atol=1e-6, rtol=0)
    torch.testing.assert_close(early, _rotation_blocks(k, d, base), atol=1e-6, rtol=0)


def test_sinusoidal_dot_product_depends_only_on_offset():
    pe = sinusoidal_encoding(300, 32)
    for k in (0, 4, 30):
        dots = (pe[: 300 - k] * pe[k:]).sum(-1)
        torch.testing.assert_close(dots, dots[:1].expand_as(dots), atol=1e-4, rtol=0)


def test_sinusoidal_module_adds_table_and_grows_beyond_max_len():
    enc = SinusoidalPositionalEncoding(8, max_len=4)
    x = torch.randn(2, 10, 8)
    out = enc(x)  # longer than max_len: the formula has no limit
    torch.testing.assert_close(out, x + sinusoidal_encoding(10, 8))
    # positions shift the table (cached decoding): rows 7, 8, 9
    torch.testing.assert_close(enc(x[:, :3], torch.arange(7, 10)), x[:, :3] + sinusoidal_encoding(10, 8)[7:])
    per_seq = torch.tensor([[0, 1, 2], [5, 6, 7]])
    torch.testing.assert_close(enc(x[:, :3], per_seq), x[:, :3] + sinusoidal_encoding(8, 8)[per_seq])
    assert not list(enc.parameters())


# --------------------------------------------------------------------------------------------
# Learned positions
# --------------------------------------------------------------------------------------------


def test_learned_embedding_adds_its_rows_and_trains():
    emb = LearnedPositionalEmbedding(max_len=6, d_model=4)
    x = torch.randn(3, 6, 4)
    out = emb(x)
    torch.testing.assert_close(out, x + emb.weight[None])
    out.sum().backward()
    torch.testing.assert_close(emb.weight.grad, torch.full((6, 4), 3.0))  # each row used once per sequence


def test_learned_embedding_has_no_row_beyond_max_len():
    emb = LearnedPositionalEmbedding(max_len=512, d_model=4)
    emb(torch.randn(1, 512, 4))  # exactly max_len tokens: fine
    with pytest.raises(ValueError, match="no embedding for position 512"):
        emb(torch.randn(1, 513, 4))
    with pytest.raises(ValueError, match="cannot extrapolate"):
        emb(torch.randn(1, 1, 4), positions=torch.tensor([600]))


# --------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------


def _scores(rope: RotaryEmbedding, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """(R_m q) · (R_n k) for q, k of shape (..., head_dim)."""
    rq = rope(q[..., None, :], torch.tensor([m]))[..., 0, :]
    rk = rope(k[..., None, :], torch.tensor([n]))[..., 0, :]
    return (rq * rk).sum(-1)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_scores_depend_only_on_relative_position(interleaved):
    rope = RotaryEmbedding(16, interleaved=interleaved)
    q, k = torch.randn(5, 16, dtype=torch.float64), torch.randn(5, 16, dtype=torch.float64)
    for m, n in [(0, 0), (3, 7), (10, 2), (40, 41)]:
        base = _scores(rope, q, k, m, n)
        for shift in (1, 13, 500):
            torch.testing.assert_close(_scores(rope, q, k, m + shift, n + shift), base, atol=1e-4, rtol=1e-4)
    # ... and they do depend on the offset
    assert not torch.allclose(_scores(rope, q, k, 0, 1), _scores(rope, q, k, 0, 5), atol=1e-2)


def test_rope_full_attention_scores_are_shift_invariant():
    rope = RotaryEmbedding(8)
    q, k = torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    pos = torch.arange(6)
    s0 = rope(q, pos) @ rope(k, pos).transpose(-2, -1)
    s1 = rope(q, pos + 1000) @ rope(k, pos + 1000).transpose(-2, -1)
    torch.testing.assert_close(s0, s1, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_preserves_norms_and_is_identity_at_position_zero(interleaved):
    rope = RotaryEmbedding(32, interleaved=interleaved)
    x = torch.randn(2, 4, 50, 32)
    out = rope(x, torch.arange(50) * 7)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(rope(x[:, :, :1], torch.tensor([0])), x[:, :, :1])


def test_rope_interleaved_is_complex_multiplication():
    """Meta's LLaMA code: view pairs (2i, 2i+1) as complex numbers and multiply by e^{i m θ_i}."""
    d, base = 12, 10000.0
    x = torch.randn(2, 3, 7, d)
    pos = torch.arange(7) + 4
    theta = 1.0 / base ** (torch.arange(0, d, 2).float() / d)
    rotor = torch.polar(torch.ones(7, d // 2), pos[:, None].float() * theta)  # e^{i m θ_i}, (seq, d/2)
    expected = torch.view_as_real(torch.view_as_complex(x.reshape(2, 3, 7, d // 2, 2)) * rotor).flatten(-2)
    torch.testing.assert_close(RotaryEmbedding(d, base, interleaved=True)(x, pos), expected)


def test_rope_half_split_matches_hf_rotate_half():
    """HF LLaMA: q * cos + rotate_half(q) * sin with cos = cat(freqs, freqs).cos()."""
    d = 8
    x = torch.randn(1, 2, 5, d)
    pos = torch.arange(5)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat([pos[:, None].float() * inv_freq] * 2, dim=-1)
    rotate_half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    expected = x * emb.cos() + rotate_half * emb.sin()
    torch.testing.assert_close(RotaryEmbedding(d)(x, pos), expected)


def test_rope_conventions_agree_after_the_permutation():
    d = 16
    perm = rotary_permutation(d)
    assert perm.tolist() == [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15]
    x = torch.randn(2, 3, 9, d)
    pos = torch.arange(9) * 3
    half, inter = RotaryEmbedding(d, interleaved=False), RotaryEmbedding(d, interleaved=True)
    torch.testing.assert_close(half(x[..., perm], pos), inter(x, pos)[..., perm])
    # Permuting the features of both q and k leaves the scores unchanged.
    q, k = torch.randn(1, 1, 9, d), torch.randn(1, 1, 9, d)
    torch.testing.assert_close(
        half(q[..., perm], pos) @ half(k[..., perm], pos).transpose(-2, -1),
        inter(q, pos) @ inter(k, pos).transpose(-2, -1), atol=1e-5, rtol=1e-5,
    )


def test_rope_per_sequence_positions_and_fractional_positions():
    rope = RotaryEmbedding(8)
    x = torch.randn(2, 3, 4, 8)
    per_seq = torch.tensor([[0, 1, 2, 3], [10, 11, 12, 13]])
    out = rope(x, per_seq)
    torch.testing.assert_close(out[0], rope(x[:1], torch.arange(4))[0])
    torch.testing.assert_close(out[1], rope(x[1:], torch.arange(10, 14))[0])
    # fractional positions (position interpolation): position 1.0 equals integer position 1
    torch.testing.assert_close(rope(x, torch.arange(4) / 1.0), rope(x, torch.arange(4)))
    half_step = rope(x, torch.arange(4) / 2)
    assert not torch.allclose(half_step, rope(x, torch.arange(4)))


def test_rope_keeps_dtype():
    rope = RotaryEmbedding(8)
    x = torch.randn(1, 2, 3, 8, dtype=torch.bfloat16)
    out = rope(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), rope(x.float()), atol=2e-2, rtol=2e-2)


def test_rope_plugs_into_attention_and_cached_decoding_matches_full_pass():
    torch.manual_seed(1)
    mha = MultiHeadAttention(32, 4, rotary=RotaryEmbedding(8)).eval()
    x = torch.randn(2, 7, 32)
    full, _ = mha(x, causal=True)
    cache = KVCache(1, batch_size=2, n_kv_heads=4, head_dim=8, max_len=7)
    steps = [mha(x[:, :3], cache=cache, causal=True)[0]]
    for t in range(3, 7):  # one new token at a time; MHA passes positions past + arange(1)
        steps.append(mha(x[:, t : t + 1], cache=cache, causal=True)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_attention_is_permutation_equivariant_without_positions_but_not_with_rope():
    x = torch.randn(1, 6, 16)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    plain = MultiHeadAttention(16, 2).eval()
    torch.testing.assert_close(plain(x[:, perm])[0], plain(x)[0][:, perm], atol=1e-6, rtol=1e-5)
    rotary = MultiHeadAttention(16, 2, rotary=RotaryEmbedding(8)).eval()
    rotary.load_state_dict(plain.state_dict())
    assert not torch.allclose(rotary(x[:, perm])[0], rotary(x)[0][:, perm], atol=1e-3)


# --------------------------------------------------------------------------------------------
# ALiBi
# --------------------------------------------------------------------------------------------


def test_alibi_slopes_powers_of_two():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -k for k in range(1, 9)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]))
    torch.testing.assert_close(alibi_slopes(1), torch.tensor([2.0 ** -8]))
    torch.testing.assert_close(alibi_slopes(16), torch.tensor([2.0 ** (-k / 2) for k in range(1, 17)]))


def test_alibi_slopes_other_head_counts_follow_the_authors_rule():
    # 6 heads: the 4-head slopes, then every other 8-head slope (1/2, 1/8) for the 2 extra heads.
    expected6 = torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3])
    torch.testing.assert_close(alibi_slopes(6), expected6)
    # 12 heads: the 8-head slopes, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 from the 16-head sequence.
    expected = [2.0 ** -k for k in range(1, 9)] + [2.0 ** -(k + 0.5) for k in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected))
    assert len(set(alibi_slopes(12).tolist())) == 12  # no two heads share a slope


def test_alibi_bias_is_minus_slope_times_distance():
    slopes = alibi_slopes(4)
    bias = alibi_bias(4, 5, causal=False)
    assert bias.shape == (4, 5, 5)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h].item() * abs(i - j))
    causal = alibi_bias(4, 5, causal=True)
    upper = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert torch.isneginf(causal[:, upper]).all()
    torch.testing.assert_close(causal[:, ~upper], bias[:, ~upper])


def test_alibi_bias_queries_are_the_last_positions():
    full = alibi_bias(2, 9, causal=True)
    torch.testing.assert_close(alibi_bias(2, 1, 9, causal=True), full[:, -1:])
    torch.testing.assert_close(alibi_bias(2, 3, 9, causal=False), alibi_bias(2, 9, causal=False)[:, -3:])


def test_alibi_plugs_into_attention_as_a_bias():
    """With content-free scores (zero q/k projections) the weights are exactly softmax(bias)."""
    mha = MultiHeadAttention(16, 4).eval()
    with torch.no_grad():
        mha.in_proj.weight[:32].zero_()  # the rows of W_q and W_k
    x = torch.randn(2, 6, 16)
    bias = alibi_bias(4, 6, causal=True)
    _, weights = mha(x, bias=bias, causal=True, need_weights=True)
    torch.testing.assert_close(weights, torch.softmax(bias, -1).expand(2, 4, 6, 6))
    # nearer keys get more weight, steeper heads more so
    assert (weights[0, :, -1, -1] > weights[0, :, -1, -2]).all()
    assert weights[0, 0, -1, -1] > weights[0, 3, -1, -1]
    # fused path gives the same output
    out_fused, _ = mha(x, bias=bias, causal=True)
    out_explicit, _ = mha(x, bias=bias, causal=True, need_weights=True)
    torch.testing.assert_close(out_fused, out_explicit, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# T5 relative buckets
# --------------------------------------------------------------------------------------------


def _hf_bucket(relative_position: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """HF transformers' T5Attention._relative_position_bucket, rewritten for one int.

    Its definition: in bidirectional mode, halve num_buckets and shift positive offsets
    (key after query) by that half, then use |offset|; otherwise use max(-offset, 0). Distances
    below max_exact = num_buckets // 2 are their own bucket; larger ones get
    max_exact + int(log(n / max_exact) / log(max_distance / max_exact) * (num_buckets - max_exact))
    computed in float32 (torch's .float()), capped at num_buckets - 1.
    """
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if relative_position > 0 else 0
        n = abs(relative_position)
    else:
        n = max(-relative_position, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    ratio = np.float32(n) / np.float32(max_exact)
    large = max_exact + int(np.float32(np.log(ratio)) / np.float32(math.log(max_distance / max_exact))
                            * np.float32(num_buckets - max_exact))
    return bucket + min(large, num_buckets - 1)


OFFSETS = [0, 1, -1, 2, -2, 5, -5, 7, -7, 8, -8, 9, -9, 11, -11, 12, -12, 15, -15, 16, -16, 17, -17, 20, -20,
           23, -23, 24, -24, 31, -31, 32, -32, 33, -33, 45, -45, 50, -50, 63, -63, 64, -64, 65, -65, 90, -90,
           100, -100, 127, -127, 128, -128, 129, -129, 200, -200, 255, -255, 256, -256, 1000, -1000]


@pytest.mark.parametrize(
    "bidirectional, num_buckets, max_distance",
    [(True, 32, 128), (False, 32, 128), (True, 16, 64), (False, 16, 32), (True, 64, 256), (False, 8, 20)],
)
def test_t5_buckets_match_hf_formula(bidirectional, num_buckets, max_distance):
    got = t5_relative_position_bucket(torch.tensor(OFFSETS), bidirectional, num_buckets, max_distance)
    expected = [_hf_bucket(o, bidirectional, num_buckets, max_distance) for o in OFFSETS]
    assert got.tolist() == expected


def test_t5_buckets_known_values():
    # Worked by hand for T5's defaults (32 buckets, max_distance 128).
    bidir = dict(zip([-1, 1, -7, -8, -12, -50, 50, -127, -128, -5000, 5000],
                     [1, 17, 7, 8, 9, 13, 29, 15, 15, 15, 31]))
    got = t5_relative_position_bucket(torch.tensor(list(bidir)), True, 32, 128)
    assert got.tolist() == list(bidir.values())
    causal = dict(zip([3, 0, -3, -15, -16, -50, -127, -128, -999], [0, 0, 3, 15, 16, 24, 31, 31, 31]))
    got = t5_relative_position_bucket(torch.tensor(list(causal)), False, 32, 128)
    assert got.tolist() == list(causal.values())


@pytest.mark.parametrize("bidirectional, num_buckets, max_distance",
                         [(True, 32, 128), (False, 32, 128), (False, 16, 40)])
def test_t5_buckets_are_exact_then_logarithmic_then_clipped(bidirectional, num_buckets, max_distance):
    per_side = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_side // 2
    distance = torch.arange(0, 4 * max_distance)
    past = t5_relative_position_bucket(-distance, bidirectional, num_buckets, max_distance)  # keys before the query
    assert ((past >= 0) & (past < num_buckets)).all()
    assert (past.diff() >= 0).all()  # monotone in distance
    torch.testing.assert_close(past[:max_exact], distance[:max_exact])  # exact for small distances
    assert (past[max_exact:] >= max_exact).all()
    assert (past[max_distance:] == per_side - 1).all()  # clipped beyond max_distance
    assert past[max_distance - 1] <= per_side - 1
    if bidirectional:
        future = t5_relative_position_bucket(distance[1:], True, num_buckets, max_distance)
        torch.testing.assert_close(future, past[1:] + per_side)  # same buckets, other half
    else:
        future = t5_relative_position_bucket(distance, False, num_buckets, max_distance)
        assert (future == 0).all()  # a decoder never sees the future: one shared bucket


def test_t5_bias_module_looks_up_its_table():
    t5 = T5RelativePositionBias(n_heads=3, num_buckets=8, max_distance=16, bidirectional=False)
    bias = t5(5, 7)
    assert bias.shape == (3, 5, 7)
    buckets = t5.buckets(5, 7)
    for i in range(5):
        for j in range(7):
            query, key = i + 2, j  # the 5 queries are the last of the 7 positions
            assert buckets[i, j] == t5_relative_position_bucket(torch.tensor(key - query), False, 8, 16)
            torch.testing.assert_close(bias[:, i, j], t5.relative_attention_bias.weight[buckets[i, j]])
    torch.testing.assert_close(t5(1, 7), t5(7)[:, -1:])


def test_t5_bias_plugs_into_attention_and_learns():
    t5 = T5RelativePositionBias(n_heads=2, num_buckets=8, max_distance=16)
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    out, _ = scaled_dot_product_attention(q, k, v, bias=t5(4))
    out.square().sum().backward()
    assert t5.relative_attention_bias.weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: sinusoidal_encoding(-1, 8), "max_len"),
        (lambda: sinusoidal_encoding(8, -4), "d_model"),
        (lambda: sinusoidal_encoding(8, 7), "d_model must be even"),
        (lambda: sinusoidal_encoding(8, 8, base=0.0), "base"),
        (lambda: SinusoidalPositionalEncoding(0), "d_model"),
        (lambda: LearnedPositionalEmbedding(-3, 8), "max_len"),
        (lambda: LearnedPositionalEmbedding(8, 0), "d_model"),
        (lambda: RotaryEmbedding(7), "head_dim must be even"),
        (lambda: RotaryEmbedding(-8), "head_dim"),
        (lambda: RotaryEmbedding(8, base=-1.0), "base"),
        (lambda: rotary_permutation(5), "head_dim"),
        (lambda: alibi_slopes(0), "n_heads"),
        (lambda: alibi_bias(-2, 4), "n_heads"),
        (lambda: alibi_bias(4, 0), "q_len"),
        (lambda: alibi_bias(4, 3, -1), "k_len"),
        (lambda: T5RelativePositionBias(0), "n_heads"),
        (lambda: T5RelativePositionBias(4, num_buckets=2, bidirectional=True), "num_buckets"),
        (lambda: T5RelativePositionBias(4, num_buckets=32, max_distance=8), "max_distance"),
        (lambda: t5_relative_position_bucket(torch.arange(3), num_buckets=-32), "num_buckets"),
    ],
)
def test_bad_sizes_raise_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_tensors_raise_clear_errors():
    rope = RotaryEmbedding(8)
    with pytest.raises(ValueError, match="head_dim=8"):
        rope(torch.randn(1, 2, 3, 6))
    with pytest.raises(TypeError, match="floating-point"):
        rope(torch.ones(1, 2, 3, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="positions must have shape"):
        rope(torch.randn(1, 2, 3, 8), torch.arange(4))
    with pytest.raises(ValueError, match="positions must be >= 0"):
        rope(torch.randn(1, 2, 3, 8), torch.tensor([-1, 0, 1]))
    with pytest.raises(TypeError, match="interleaved"):
        RotaryEmbedding(8, interleaved="yes")
    enc = SinusoidalPositionalEncoding(8)
    with pytest.raises(ValueError, match=r"\(batch, seq, d_model=8\)"):
        enc(torch.randn(2, 3, 4))
    with pytest.raises(TypeError, match="positions must be an integer"):
        enc(torch.randn(2, 3, 8), torch.arange(3.0))
    with pytest.raises(TypeError, match="relative_position must be an integer"):
        t5_relative_position_bucket(torch.arange(3.0))
    with pytest.raises(TypeError, match="causal must be a bool"):
        alibi_bias(4, 3, causal=1)
