"""Linformer: self-attention in O(L·k) by projecting keys and values along the sequence (Wang et al., 2020).

Softmax attention compares every query with every key: the weights ``P = softmax(Q Kᵀ / √head_dim)``
form an ``(L, L)`` matrix per head, so time and memory grow as L². Wang et al. observe that P is
close to low-rank (most of its spectrum sits in a few singular values) and replace it by a rank-k
one: learned matrices E and F, each ``(k, max_len)``, compress the L keys and the L values into k
"summary" keys and values *along the sequence axis*::

    head = softmax(Q (E K)ᵀ / √head_dim) (F V)        # scores (L, k) instead of (L, L)

The cost per head is O(L·k·head_dim) in time and O(L·k) in memory: linear in L for a fixed k.
Their analysis (§4, a Johnson–Lindenstrauss argument) shows that even *random* E and F keep the
output within ε with a k that depends on head_dim and ε but not on L; learned ones do better.

Choices made here:

* **Headwise sharing** (the paper's §4 option): one E and one F per layer, shared by all heads
  (not per head, not one E = F for all layers).
* **Fixed length.** E and F have ``max_len`` columns, one per position: the paper trains at a
  fixed length. A shorter input of length L uses the first L columns (E[:, :L]); an input longer
  than ``max_len`` has no columns to use and raises a ``ValueError`` — the method's limitation.
* **Non-causal only.** Each summary key ``(E K)_i = Σ_j E_ij k_j`` mixes *every* position,
  future ones included, so no mask on the ``(L, k)`` scores can stop a query from seeing the
  future: Linformer is an encoder (bidirectional) method, and ``causal=True`` raises.

With ``k = L`` and E = F = the identity, the layer is ordinary multi-head attention (the tests
check this exactly). Usage::

    attn = LinformerAttention(d_model=64, n_heads=4, max_len=512, k=32)
    out, _ = attn(torch.randn(2, 300, 64))          # (2, 300, 64); scores (2, 4, 300, 32)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from companion.attention._checks import check_length, check_probability, check_tensor
from companion.attention.functional import _sdpa, scaled_dot_product_attention

__all__ = ["LinformerAttention"]


class LinformerAttention(nn.Module):
    """Multi-head self-attention with keys and values projected to ``k`` positions (Wang et al., 2020).

    ``head_i = softmax(Q_i (E K_i)ᵀ / √head_dim) (F V_i)``, with one learned E and one learned F,
    ``(k, max_len)`` each, shared by the heads of this layer (headwise sharing). Scores are
    ``(batch, heads, seq, k)``: O(seq·k) instead of O(seq²).

    Args:
        d_model: model width.
        n_heads: heads; must divide ``d_model`` (``head_dim = d_model // n_heads``).
        max_len: the longest sequence, i.e. the number of columns of E and F. Shorter inputs use
            the first ``seq`` columns; longer ones raise a ``ValueError`` (the paper trains at a
            fixed length; E and F have nothing to say about positions they never saw).
        k: the projected length (the rank of the approximation), ``1 <= k``. ``k >= seq`` gives no
            saving.
        dropout: dropout on the ``(seq, k)`` attention weights, in training mode only.
        bias: whether the Q/K/V and output projections have biases.

    ``in_proj`` (W^Q, W^K, W^V stacked) and ``out_proj`` are laid out as in
    :class:`~companion.attention.MultiHeadAttention`, so weights copy across. ``E`` and ``F`` are
    ``nn.Parameter`` of shape ``(k, max_len)``, initialised Xavier-uniform with gain 1/√2 (as
    fairseq's reference implementation does).
    """

    def __init__(self, d_model: int, n_heads: int, max_len: int, k: int, dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        check_length("d_model", d_model)
        check_length("n_heads", n_heads)
        check_length("max_len", max_len)
        check_length("k", k)
        if d_model % n_heads:
            raise ValueError(f"d_model must be divisible by n_heads, got d_model={d_model}, n_heads={n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.max_len, self.k = max_len, k
        self.dropout = check_probability("dropout", dropout)
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.E = nn.Parameter(torch.empty(k, max_len))  # compresses the keys along the sequence
        self.F = nn.Parameter(torch.empty(k, max_len))  # compresses the values
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections with zero biases; Xavier-uniform E and F (gain 1/√2)."""
        nn.init.xavier_uniform_(self.in_proj.weight)
        self.out_proj.reset_parameters()
        for lin in (self.in_proj, self.out_proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        for p in (self.E, self.F):
            nn.init.xavier_uniform_(p, gain=2 ** -0.5)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, head_dim={self.head_dim}, "
                f"max_len={self.max_len}, k={self.k}, dropout={self.dropout}")

    def _check_inputs(self, x: Tensor, causal: bool) -> None:
        check_tensor("x", x)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, seq, d_model={self.d_model}), got {tuple(x.shape)}")
        if x.shape[1] > self.max_len:
            raise ValueError(f"x has seq={x.shape[1]} positions but this LinformerAttention was built with "
                             f"max_len={self.max_len}: expected seq <= {self.max_len} (E and F have one column "
                             f"per position; Linformer works at the length it was trained for)")
        if causal:
            raise ValueError("LinformerAttention is non-causal only (got causal=True): each projected key "
                             "E K mixes every position, future ones included, so no mask can hide the future")

    def forward(self, x: Tensor, need_weights: bool = False, *, causal: bool = False
                ) -> tuple[Tensor, Tensor | None]:
        """Self-attention of ``x`` through k projected keys and values.

        Args:
            x: ``(batch, seq, d_model)`` with ``seq <= max_len``.
            need_weights: also return the weights ``(batch, heads, seq, k)`` (explicit path);
                otherwise PyTorch's fused kernel computes the same output.
            causal: must be False: Linformer cannot be causal (see the module docstring).

        Returns:
            ``(output, weights)``: output ``(batch, seq, d_model)``; weights as above or None.
        """
        self._check_inputs(x, causal)
        batch, seq, _ = x.shape
        h, d = self.n_heads, self.head_dim
        q, keys, values = self.in_proj(x).split(self.d_model, dim=-1)
        # (batch, seq, heads * head_dim) -> (batch, heads, seq, head_dim)
        q, keys, values = (t.view(batch, seq, h, d).transpose(1, 2) for t in (q, keys, values))
        E, F = self.E[:, :seq], self.F[:, :seq]  # (k, seq): the first seq columns
        keys = E @ keys  # (batch, heads, k, head_dim): k summary keys, each a mix of all positions
        values = F @ values  # (batch, heads, k, head_dim)
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = scaled_dot_product_attention(q, keys, values, dropout_p=dropout_p)  # (.., seq, k)
        else:
            out, weights = _sdpa(q, keys, values, None, None, dropout_p, None, False), None
        out = out.transpose(1, 2).reshape(batch, seq, h * d)  # concatenate the heads
        return self.out_proj(out), weights
