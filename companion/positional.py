"""Positional information: five ways to tell attention where each token sits.

Attention on its own is permutation-equivariant: shuffle the tokens and the outputs come back
shuffled the same way, so "dog bites man" and "man bites dog" look alike. Each scheme below
breaks that symmetry in a different place.

Added to the token embeddings ``(batch, seq, d_model)`` before the first layer (absolute):

* :func:`sinusoidal_encoding` / :class:`SinusoidalPositionalEncoding` — fixed sines and cosines
  of geometrically spaced frequencies (Vaswani et al., 2017, §3.5).
* :class:`LearnedPositionalEmbedding` — one trained vector per position, as in BERT and GPT-2;
  it has nothing to offer at a position it never had a row for.

Applied inside every attention layer (relative):

* :class:`RotaryEmbedding` (RoPE, Su et al., 2021) — rotates each 2-D pair of query and key
  features by an angle proportional to the position, so ``q_m · k_n`` depends on ``m - n`` only.
  It is the ``rotary`` hook of :class:`companion.attention.MultiHeadAttention`. Its ``scaling``
  stretches it past the trained length: position interpolation (``"linear"``, Chen et al., 2023)
  or dynamic NTK scaling (``"dynamic"``).
* :func:`alibi_bias` (ALiBi, Press et al., 2022) — a fixed additive penalty ``-m_h · |i - j|``
  on the scores, with one slope ``m_h`` per head (:func:`alibi_slopes`).
* :class:`T5RelativePositionBias` (Raffel et al., 2020) — a learned scalar per head and per
  *bucket* of relative distance (:func:`t5_relative_position_bucket`): exact buckets for small
  distances, logarithmically wider ones up to ``max_distance``.

ALiBi and T5 biases have shape ``(heads, q_len, k_len)`` and are passed as the ``bias`` argument
of attention, which broadcasts them over the batch. As in :func:`companion.attention.causal_mask`,
the ``q_len`` queries are the *last* ``q_len`` of the ``k_len`` positions, so the same call
serves cached decoding (one new query, many cached keys).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from companion._validation import check_features, check_int, check_positive_float, tracing

__all__ = [
    "sinusoidal_encoding",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "rotary_permutation",
    "alibi_slopes",
    "alibi_bias",
    "t5_relative_position_bucket",
    "T5RelativePositionBias",
    "Positions",
]


# --------------------------------------------------------------------------------------------
# Input checks.
# --------------------------------------------------------------------------------------------






def _check_even(name: str, value: object) -> int:
    check_int(name, value, 2)
    if value % 2:
        raise ValueError(f"{name} must be even (features are used in pairs of sine/cosine or of a rotation), "
                         f"got {value}")
    return value



def _default_positions(positions: Tensor | None, batch: int, seq: int, device: torch.device,
                       allow_float: bool = False) -> Tensor:
    """``positions`` checked to be ``(seq,)`` or ``(batch, seq)``; ``arange(seq)`` when None."""
    if positions is None:
        return torch.arange(seq, device=device)
    if (not isinstance(positions, Tensor) or (positions.is_floating_point() and not allow_float)
            or positions.is_complex()):
        got = positions.dtype if isinstance(positions, Tensor) else type(positions).__name__
        kind = "a real-valued" if allow_float else "an integer"
        raise TypeError(f"positions must be {kind} torch.Tensor, got {got}")
    if tuple(positions.shape) not in ((seq,), (batch, seq)):
        raise ValueError(f"positions must have shape (seq,)=({seq},) or (batch, seq)=({batch}, {seq}), "
                         f"got {tuple(positions.shape)}")
    if positions.numel() and not tracing() and positions.min() < 0:
        raise ValueError(f"positions must be >= 0, got a minimum of {positions.min().item()}")
    return positions.to(device)


# --------------------------------------------------------------------------------------------
# Absolute positions, added to the embeddings.
# --------------------------------------------------------------------------------------------


def sinusoidal_encoding(max_len: int, d_model: int, base: float = 10000.0, *,
                        device: torch.device | str | None = None) -> Tensor:
    """The sinusoidal table ``PE`` of shape ``(max_len, d_model)`` (Vaswani et al., 2017, §3.5).

    ``PE[pos, 2i] = sin(pos · ω_i)`` and ``PE[pos, 2i+1] = cos(pos · ω_i)`` with
    ``ω_i = base^(-2i / d_model)``: pair ``i`` is a point on the unit circle turning at angular
    speed ``ω_i``, from one turn per 2π positions (``i = 0``) to one per ``2π · base`` positions.
    Because ``(sin, cos)`` at ``pos + k`` is the one at ``pos`` rotated by ``k · ω_i``,
    ``PE[pos + k] = R_k PE[pos]`` with a block-diagonal rotation ``R_k`` that depends on ``k`` only.

    Args:
        max_len: number of positions (rows), ``>= 1``.
        d_model: width, even (sine/cosine pairs).
        base: the wavelength scale; 10000 in the paper.
    """
    check_int("max_len", max_len, 1)
    _check_even("d_model", d_model)
    base = check_positive_float("base", base)
    # float64 for the angles (pos * ω loses digits in float32 once pos reaches the thousands), on
    # the CPU because some accelerators (MPS) have no float64; the table is moved afterwards.
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    omega = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d_model/2,)
    angles = pos * omega  # (max_len, d_model/2)
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.to(device=device, dtype=torch.get_default_dtype())


class SinusoidalPositionalEncoding(nn.Module):
    """Adds :func:`sinusoidal_encoding` to token embeddings: ``x + PE[positions]``.

    Nothing is learned, and the table is a formula, so any position works: the module computes
    (and keeps) as many rows as the longest input needs. ``max_len`` only sizes the initial table.

    Args:
        d_model: width of the embeddings, even.
        max_len: rows computed up front (more are added on demand).
        base: see :func:`sinusoidal_encoding`.
    """

    def __init__(self, d_model: int, max_len: int = 512, base: float = 10000.0) -> None:
        super().__init__()
        self.d_model = _check_even("d_model", d_model)
        self.base = check_positive_float("base", base)
        table = sinusoidal_encoding(check_int("max_len", max_len, 1), d_model, base)
        self.register_buffer("pe", table, persistent=False)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, base={self.base:g}"

    def forward(self, x: Tensor, positions: Tensor | None = None, *, start: int = 0) -> Tensor:
        """``x + PE[positions]``.

        Args:
            x: token embeddings ``(batch, seq, d_model)``.
            positions: integer positions ``(seq,)`` or ``(batch, seq)``; default
                ``start + arange(seq)``.
            start: the first position when ``positions`` is None (the cached length when decoding
                with a cache); the rows are then a slice of the table, with no gather.

        Returns:
            ``(batch, seq, d_model)``.
        """
        check_features(x, self.d_model, ndim=3)
        if positions is None:
            end = check_int("start", start, 0) + x.shape[1]
            self._grow(end)
            return x + self.pe[start:end].to(device=x.device, dtype=x.dtype)
        positions = _default_positions(positions, x.shape[0], x.shape[1], x.device)
        if not tracing():  # a compiled model's positions must fit the table it has
            self._grow(int(positions.max()) + 1 if positions.numel() else 0)
        return x + self.pe[positions].to(device=x.device, dtype=x.dtype)

    def _grow(self, needed: int) -> None:
        if needed > self.pe.shape[0]:  # grow the table: a formula has no length limit
            rows = max(needed, 2 * self.pe.shape[0])
            with torch.inference_mode(False):  # an ordinary buffer even when grown while decoding
                self.pe = sinusoidal_encoding(rows, self.d_model, self.base, device=self.pe.device)


class LearnedPositionalEmbedding(nn.Module):
    """One trained vector per position, added to the token embeddings (BERT, GPT-2).

    A ``(max_len, d_model)`` table, initialised like GPT-2's (normal, std 0.02). Positions
    ``0 … max_len - 1`` have a row; any other position has none, and asking for it raises a
    ``ValueError`` — the hard length limit of learned absolute positions.

    Args:
        max_len: number of positions with a learned vector.
        d_model: width of the embeddings.
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = check_int("max_len", max_len, 1)
        self.d_model = check_int("d_model", d_model, 1)
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"

    def forward(self, x: Tensor, positions: Tensor | None = None, *, start: int = 0) -> Tensor:
        """``x + weight[positions]``.

        Args:
            x: token embeddings ``(batch, seq, d_model)``.
            positions: integer positions ``(seq,)`` or ``(batch, seq)``; default
                ``start + arange(seq)``.
            start: the first position when ``positions`` is None (the cached length when decoding
                with a cache); the rows are then a slice of the table, with no gather.

        Returns:
            ``(batch, seq, d_model)``.

        Raises:
            ValueError: if a position is ``>= max_len``: there is no embedding for it.
        """
        check_features(x, self.d_model, ndim=3)
        if positions is None:
            end = check_int("start", start, 0) + x.shape[1]
            self._check_last(end - 1)
            return x + self.weight[start:end].to(x.dtype)
        positions = _default_positions(positions, x.shape[0], x.shape[1], x.device)
        if positions.numel() and not tracing():
            self._check_last(int(positions.max()))
        return x + self.weight[positions].to(x.dtype)

    def _check_last(self, last: int) -> None:
        if last >= self.max_len:
            raise ValueError(
                f"LearnedPositionalEmbedding has vectors for positions 0..{self.max_len - 1} (max_len={self.max_len}); "
                f"there is no embedding for position {last} (a sequence of {last + 1} tokens). "
                "Learned absolute positions cannot extrapolate beyond the length they were trained for."
            )


# --------------------------------------------------------------------------------------------
# Rotary position embeddings: rotate queries and keys.
# --------------------------------------------------------------------------------------------


def rotary_permutation(head_dim: int) -> Tensor:
    """The feature order that turns the interleaved RoPE layout into the half-split one.

    Interleaved (RoFormer, Meta's LLaMA code) pairs features ``(2i, 2i+1)``; half-split (HF
    LLaMA, GPT-NeoX) pairs ``(i, i + head_dim/2)``. With ``perm = [0, 2, 4, …, 1, 3, 5, …]``::

        RotaryEmbedding(d, interleaved=False)(x[..., perm], pos)
            == RotaryEmbedding(d, interleaved=True)(x, pos)[..., perm]

    Applying ``perm`` to the output rows of ``W_q`` and ``W_k`` is how checkpoints are converted
    between the two conventions (the ``permute`` of HF's LLaMA conversion script); the attention
    scores do not change, because ``q · k`` is the same in any common feature order.

    Returns:
        A LongTensor ``(head_dim,)``.
    """
    _check_even("head_dim", head_dim)
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


class RotaryEmbedding(nn.Module):
    """Rotary position embedding, RoPE (Su et al., 2021, eq. 13-15): the ``rotary`` hook of attention.

    Features come in ``head_dim / 2`` pairs; pair ``i`` of a query or key at position ``m`` is
    rotated by the angle ``m · θ_i`` with ``θ_i = base^(-2i / head_dim)``::

        (x₁, x₂) ↦ (x₁ cos mθ_i − x₂ sin mθ_i,  x₂ cos mθ_i + x₁ sin mθ_i)

    which is multiplication of the complex number ``x₁ + i x₂`` by ``e^{i m θ_i}``. Since
    ``R_mᵀ R_n = R_{n−m}``, the score ``(R_m q) · (R_n k) = q · R_{n−m} k`` depends on the offset
    only, and rotations preserve norms. No parameters are learned.

    A model trained on ``max_len`` tokens has never seen the angles of later positions.
    ``scaling`` keeps them in (or near) the trained range, as Hugging Face's ``rope_type``:

    * ``"linear"`` — position interpolation (Chen et al., 2023): ``θ_i / factor``, i.e. position
      ``m`` is rotated as ``m / factor`` was, so ``factor · max_len`` positions fit the trained
      angles (at the price of finer offsets the model has to tell apart).
    * ``"dynamic"`` — dynamic NTK scaling: sequences of up to ``max_len`` tokens are rotated as
      without scaling; a call whose largest position is ``seq − 1 >= max_len`` uses the base
      ``base · (factor · seq / max_len − (factor − 1))^(head_dim / (head_dim − 2))``, which slows
      the low frequencies most and leaves the fastest pair (``i = 0``) unchanged. The base is
      computed from the positions *of the call* (on the device, without a host sync): with a KV
      cache the cached keys keep the rotation of the step that wrote them, as in Hugging Face.

    Args:
        head_dim: per-head width, even.
        base: the wavelength scale; 10000 as in RoFormer and LLaMA.
        interleaved: pair features ``(2i, 2i+1)`` (RoFormer, Meta's LLaMA) instead of
            ``(i, i + head_dim/2)`` (HF LLaMA, the default). See :func:`rotary_permutation`.
        scaling: None, ``"linear"`` or ``"dynamic"``.
        factor: the stretch of ``scaling``, ``>= 1``.
        max_len: the trained length, which ``"dynamic"`` needs.

    Call it as ``rope(x, positions)`` with ``x`` ``(batch, heads, seq, head_dim)``::

        rope = RotaryEmbedding(64, scaling="linear", factor=4.0)   # 4x the trained context
    """

    inv_freq: Tensor

    def __init__(self, head_dim: int, base: float = 10000.0, interleaved: bool = False, *,
                 scaling: str | None = None, factor: float = 1.0, max_len: int | None = None) -> None:
        super().__init__()
        self.head_dim = _check_even("head_dim", head_dim)
        self.base = check_positive_float("base", base)
        if not isinstance(interleaved, bool):
            raise TypeError(f"interleaved must be a bool, got {type(interleaved).__name__}")
        if scaling not in (None, "linear", "dynamic"):
            raise ValueError(f"scaling must be None, 'linear' or 'dynamic', got {scaling!r}")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 <= factor < math.inf:
            raise ValueError(f"factor must be a finite number >= 1, got {factor!r}")
        if scaling == "dynamic":
            check_int("max_len", max_len, 1)
            check_int("head_dim", head_dim, 4)  # the exponent head_dim / (head_dim - 2)
        self.interleaved, self.scaling, self.factor, self.max_len = interleaved, scaling, float(factor), max_len
        # θ_i = 1 / base^(2i/d), written as HF LLaMA writes it so the float32 values agree bit for bit
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))  # (head_dim/2,)
        if scaling == "linear":
            inv_freq = inv_freq / factor  # θ_i / factor: the same angles as positions / factor
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def extra_repr(self) -> str:
        scaling = f", scaling={self.scaling!r}, factor={self.factor:g}" if self.scaling else ""
        return f"head_dim={self.head_dim}, base={self.base:g}, interleaved={self.interleaved}{scaling}"

    def angles(self, positions: Tensor) -> Tensor:
        """The rotation angles ``m · θ_i``: positions ``(...)`` -> ``(..., head_dim/2)`` (float32)."""
        positions = positions.to(device=self.inv_freq.device, dtype=torch.float32)
        inv_freq = self.inv_freq
        if self.scaling == "dynamic" and positions.numel():
            # seq = largest position + 1, never below max_len (where the formula gives the base itself)
            seq = (positions.max() + 1).clamp(min=self.max_len)
            base = self.base * (self.factor * seq / self.max_len - (self.factor - 1)) ** (
                self.head_dim / (self.head_dim - 2))
            exponents = torch.arange(0, self.head_dim, 2, device=inv_freq.device, dtype=torch.float32) / self.head_dim
            inv_freq = 1.0 / base**exponents
        return positions[..., None] * inv_freq

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Rotate ``x`` to its positions.

        Args:
            x: queries or keys ``(batch, heads, seq, head_dim)`` (any leading dims with ``(seq,)``
                positions).
            positions: absolute positions of the ``seq`` tokens, ``(seq,)`` or ``(batch, seq)``;
                default ``arange(seq)``. With a KV cache pass the positions of the *new* tokens
                (``past + arange(new)``). Fractional positions are allowed (position
                interpolation rescales them).

        Returns:
            The rotated tensor, same shape and dtype as ``x``.
        """
        if not isinstance(x, Tensor) or not x.is_floating_point():
            got = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"x must be a floating-point torch.Tensor, got {got}")
        if x.dim() < 2 or x.shape[-1] != self.head_dim:
            raise ValueError(f"x must have shape (batch, heads, seq, head_dim={self.head_dim}), got {tuple(x.shape)}")
        seq = x.shape[-2]
        batch = x.shape[0] if x.dim() >= 4 else -1
        positions = _default_positions(positions, batch, seq, x.device, allow_float=True)
        angles = self.angles(positions).to(x.device)  # (seq, d/2) or (batch, seq, d/2)
        if angles.dim() == 3:  # per-sequence positions: broadcast over the heads
            angles = angles[:, None]
        cos, sin = angles.cos(), angles.sin()
        # Rotate in float32 at least: half-precision sin/cos of large angles are too coarse.
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        if self.interleaved:
            x1, x2 = xf[..., 0::2], xf[..., 1::2]
            out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        else:
            half = self.head_dim // 2
            x1, x2 = xf[..., :half], xf[..., half:]
            out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return out.to(x.dtype)


# --------------------------------------------------------------------------------------------
# ALiBi: a fixed linear penalty on distance.
# --------------------------------------------------------------------------------------------


def alibi_slopes(n_heads: int) -> Tensor:
    """The per-head slopes ``m_h`` of ALiBi (Press et al., 2022, §3), shape ``(n_heads,)``.

    For ``n`` a power of two the slopes are the geometric sequence starting at
    ``2^(-8/n)`` with that same ratio: ``2^(-8/n), 2^(-16/n), …, 2^(-8)`` (8 heads: 1/2 … 1/256).
    Otherwise, as in the authors' code, take the ``2^⌊log₂ n⌋`` slopes of the nearest lower power
    of two and fill the remaining heads with every other slope of the next power of two
    (which interleave between them).
    """
    check_int("n_heads", n_heads, 1)

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if n_heads & (n_heads - 1) == 0:
        slopes = power_of_two(n_heads)
    else:
        lower = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(lower) + power_of_two(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(n_heads: int, q_len: int, k_len: int | None = None, causal: bool = True, *,
               device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """ALiBi's additive bias ``B[h, i, j] = -m_h · |i - j|``, shape ``(n_heads, q_len, k_len)``.

    Pass it as ``bias=`` to :func:`companion.attention.scaled_dot_product_attention` or
    :class:`companion.attention.MultiHeadAttention`; it broadcasts over the batch. The queries are
    the last ``q_len`` of ``k_len`` positions (query row ``r`` is position ``r + k_len - q_len``),
    as in :func:`companion.attention.causal_mask`.

    Args:
        n_heads: number of heads (one slope each, :func:`alibi_slopes`).
        q_len, k_len: numbers of queries and keys (``k_len`` defaults to ``q_len``).
        causal: if True (a decoder), future keys ``j > i`` get ``-inf``, so the bias masks them
            as well; if False (an encoder), the penalty is symmetric in ``i - j``.
    """
    check_int("q_len", q_len, 1)
    k_len = q_len if k_len is None else check_int("k_len", k_len, 1)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    distance = (i - j).abs().to(dtype)  # (q_len, k_len)
    bias = -alibi_slopes(n_heads).to(device=device, dtype=dtype)[:, None, None] * distance  # (heads, q, k)
    if causal:
        bias = bias.masked_fill(j > i, float("-inf"))
    return bias


# --------------------------------------------------------------------------------------------
# T5: learned biases on logarithmic buckets of relative distance.
# --------------------------------------------------------------------------------------------


def t5_relative_position_bucket(relative_position: Tensor, bidirectional: bool = True, num_buckets: int = 32,
                                max_distance: int = 128) -> Tensor:
    """T5's bucket of each relative position ``key − query`` (Raffel et al., 2020, §2.1).

    The distance ``n`` (its absolute value if ``bidirectional``, else ``max(query − key, 0)``:
    a decoder's future keys share bucket 0) goes to

    * bucket ``n`` itself if ``n < max_exact = B/2``, where ``B`` is ``num_buckets`` (halved when
      ``bidirectional``: one half for keys before the query, one for keys after);
    * bucket ``max_exact + ⌊log(n / max_exact) / log(max_distance / max_exact) · (B − max_exact)⌋``
      otherwise, so bucket widths grow geometrically up to ``max_distance``;
    * bucket ``B − 1`` for every ``n`` from about ``max_distance`` on (clipped).

    With ``bidirectional`` the keys after the query get buckets ``B … 2B − 1``. The arithmetic
    (float32 logs, truncation) follows Mesh TensorFlow and HF ``transformers``'
    ``_relative_position_bucket``, so the buckets match pretrained T5 checkpoints.

    Args:
        relative_position: integer tensor of ``key_position − query_position``, any shape.

    Returns:
        LongTensor of the same shape, values in ``[0, num_buckets)``.
    """
    if (not isinstance(relative_position, Tensor) or relative_position.is_floating_point()
            or relative_position.is_complex()):
        got = relative_position.dtype if isinstance(relative_position, Tensor) else type(relative_position).__name__
        raise TypeError(f"relative_position must be an integer torch.Tensor, got {got}")
    if not isinstance(bidirectional, bool):
        raise TypeError(f"bidirectional must be a bool, got {type(bidirectional).__name__}")
    check_int("num_buckets", num_buckets, 4 if bidirectional else 2)
    buckets_per_side = num_buckets // 2 if bidirectional else num_buckets
    max_exact = buckets_per_side // 2
    check_int("max_distance", max_distance, max_exact + 1)

    relative_position = relative_position.long()
    if bidirectional:
        offset = (relative_position > 0).long() * buckets_per_side  # keys after the query: upper half
        distance = relative_position.abs()
    else:
        offset = torch.zeros_like(relative_position)
        distance = (-relative_position).clamp(min=0)
    # Clamp before the log so distances < max_exact (which use the exact branch) never take log(0).
    scaled = torch.log(distance.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    log_bucket = max_exact + (scaled * (buckets_per_side - max_exact)).long()
    log_bucket = log_bucket.clamp(max=buckets_per_side - 1)
    return offset + torch.where(distance < max_exact, distance, log_bucket)


class T5RelativePositionBias(nn.Module):
    """T5's learned relative-position bias: ``B[h, i, j] = table[bucket(j − i), h]`` (Raffel et al., 2020).

    One learned scalar per head and per bucket (:func:`t5_relative_position_bucket`), added to
    the attention scores. T5 computes it in the first layer and shares it with all the others;
    do the same by passing one instance's output to every layer.

    Args:
        n_heads: number of attention heads.
        num_buckets, max_distance, bidirectional: see :func:`t5_relative_position_bucket`
            (T5: 32, 128; bidirectional in the encoder, not in the decoder).
    """

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True) -> None:
        super().__init__()
        self.n_heads = check_int("n_heads", n_heads, 1)
        # validates num_buckets, max_distance and bidirectional together
        t5_relative_position_bucket(torch.zeros(1, dtype=torch.long), bidirectional, num_buckets, max_distance)
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)
        nn.init.normal_(self.relative_attention_bias.weight, std=0.02)

    def extra_repr(self) -> str:
        return (f"n_heads={self.n_heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
                f"bidirectional={self.bidirectional}")

    def buckets(self, q_len: int, k_len: int | None = None) -> Tensor:
        """Bucket of every (query, key) pair, ``(q_len, k_len)``; queries are the last ``q_len`` positions."""
        check_int("q_len", q_len, 1)
        k_len = q_len if k_len is None else check_int("k_len", k_len, 1)
        device = self.relative_attention_bias.weight.device
        query = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
        key = torch.arange(k_len, device=device)[None, :]
        return t5_relative_position_bucket(key - query, self.bidirectional, self.num_buckets, self.max_distance)

    def forward(self, q_len: int, k_len: int | None = None) -> Tensor:
        """The bias ``(n_heads, q_len, k_len)`` for ``q_len`` queries and ``k_len`` keys."""
        return self.relative_attention_bias(self.buckets(q_len, k_len)).permute(2, 0, 1)


# --------------------------------------------------------------------------------------------
# One model, one scheme: the positions of a stack, built once from its configuration.
# --------------------------------------------------------------------------------------------


class Positions(nn.Module):
    """Where positional information enters a stack of blocks, chosen once from ``config.position``.

    * ``"learned"`` / ``"sinusoidal"``: :meth:`add` adds the position vectors to the embeddings;
    * ``"rope"``: :attr:`rotary` is the hook every attention layer applies to its queries and keys;
    * ``"alibi"`` / ``"t5"``: :meth:`bias` is the score bias every layer adds (computed once per
      forward and shared by the layers, as T5 does; ALiBi's is a formula);
    * ``"none"``: nothing (in a causal stack the mask alone still leaks some order).

    Args:
        config: a :class:`~companion.config.ModelConfig`.
        causal: the stack's attention is causal (a decoder): ALiBi masks the future, T5 uses
            one-sided buckets.
    """

    def __init__(self, config, *, causal: bool) -> None:
        super().__init__()
        self.kind, self.causal, self.n_heads = config.position, causal, config.n_heads
        self.table: nn.Module | None = None
        self.rotary: RotaryEmbedding | None = None
        self.t5: T5RelativePositionBias | None = None
        if self.kind == "learned":
            self.table = LearnedPositionalEmbedding(config.max_len, config.d_model)
        elif self.kind == "sinusoidal":
            self.table = SinusoidalPositionalEncoding(config.d_model, config.max_len)
        elif self.kind == "rope":
            scaling = config.rope_scaling  # a companion.config.RopeScaling or None
            kind, factor = (scaling.rope_type, scaling.factor) if scaling is not None else (None, 1.0)
            self.rotary = RotaryEmbedding(config.resolved_head_dim, base=config.rope_base, scaling=kind,
                                          factor=factor, max_len=config.max_len)
        elif self.kind == "t5":
            self.t5 = T5RelativePositionBias(config.n_heads, config.t5_num_buckets, config.t5_max_distance,
                                             bidirectional=not causal)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, causal={self.causal}"

    def add(self, x: Tensor, positions: Tensor | None = None, *, start: int = 0) -> Tensor:
        """Embeddings ``x`` ``(batch, seq, d_model)`` plus the absolute positions' vectors (if any).

        ``positions`` default to ``start + arange(seq)``.
        """
        return x if self.table is None else self.table(x, positions, start=start)

    def bias(self, q_len: int, k_len: int, *, device: torch.device | None = None,
             dtype: torch.dtype = torch.float32) -> Tensor | None:
        """The score bias ``(heads, q_len, k_len)`` shared by every layer, or None.

        The queries are the last ``q_len`` of ``k_len`` positions (cached decoding).
        """
        if self.kind == "alibi":
            return alibi_bias(self.n_heads, q_len, k_len, causal=self.causal, device=device, dtype=dtype)
        if self.t5 is not None:
            return self.t5(q_len, k_len).to(dtype)
        return None
