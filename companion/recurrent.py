"""Recurrent networks written from their equations: the vanilla (Elman) RNN and the LSTM.

Both process a sequence one step at a time, which is the point of Chapter 1: step ``t`` needs
``h_{t-1}``, so the loop over time cannot be parallelised. Weights use PyTorch's layout
(``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh``; LSTM gates stacked in the order
input, forget, cell candidate, output) so that :meth:`from_torch` can copy the weights of
``torch.nn.RNN`` / ``torch.nn.LSTM`` and the tests can check we compute exactly what they do.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from companion._validation import check_choice, check_int

__all__ = ["RNN", "LSTM", "RecurrentClassifier"]


def _check_input(x: torch.Tensor, input_size: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.size(-1) != input_size:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must have shape (batch, seq, input_size={input_size}), got {shape}")
    if x.size(1) == 0:
        raise ValueError("x must hold at least one time step, got seq = 0")


def _check_sizes(input_size: int, hidden_size: int) -> None:
    for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


class RNN(nn.Module):
    r"""A single-layer vanilla RNN (Elman, 1990), batch first.

    .. math:: h_t = \tanh(W_{ih} x_t + b_{ih} + W_{hh} h_{t-1} + b_{hh})

    Args:
        input_size: features per time step, ``d_in``.
        hidden_size: size of the hidden state, ``d_h``.
        nonlinearity: ``"tanh"`` (default) or ``"relu"``.
    """

    def __init__(self, input_size: int, hidden_size: int, nonlinearity: str = "tanh"):
        super().__init__()
        _check_sizes(input_size, hidden_size)
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        self.input_size, self.hidden_size, self.nonlinearity = input_size, hidden_size, nonlinearity
        self.weight_ih = nn.Parameter(torch.empty(hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(hidden_size, hidden_size))
        self.bias_ih = nn.Parameter(torch.empty(hidden_size))
        self.bias_hh = nn.Parameter(torch.empty(hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's initialisation: every weight uniform in ``±1/sqrt(hidden_size)``."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: torch.Tensor, h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the recurrence over a sequence.

        Args:
            x: ``(batch, seq, input_size)``.
            h0: initial state ``(batch, hidden_size)``; zeros if ``None``.

        Returns:
            ``(outputs, h_T)``: every hidden state ``(batch, seq, hidden_size)`` and the last
            ``(batch, hidden_size)``.
        """
        _check_input(x, self.input_size)
        h = x.new_zeros(x.size(0), self.hidden_size) if h0 is None else h0
        if h.shape != (x.size(0), self.hidden_size):
            raise ValueError(f"h0 must have shape (batch={x.size(0)}, {self.hidden_size}), got {tuple(h.shape)}")
        act = torch.tanh if self.nonlinearity == "tanh" else torch.relu
        # The input projection does not depend on h, so it is done for all steps at once;
        # only the h -> h part is inherently sequential.
        x_proj = x @ self.weight_ih.T + self.bias_ih  # (batch, seq, hidden)
        outputs = []
        for t in range(x.size(1)):
            h = act(x_proj[:, t] + h @ self.weight_hh.T + self.bias_hh)
            outputs.append(h)
        return torch.stack(outputs, dim=1), h

    @classmethod
    def from_torch(cls, reference: nn.RNN) -> RNN:
        """A copy of a single-layer, unidirectional, batch-first ``torch.nn.RNN`` with biases."""
        _check_reference(reference, nn.RNN)
        model = cls(reference.input_size, reference.hidden_size, reference.nonlinearity)
        _copy_weights(model, reference)
        return model


class LSTM(nn.Module):
    r"""A single-layer LSTM (Hochreiter & Schmidhuber, 1997, with the forget gate of Gers et al., 2000).

    With :math:`z_t = W_{ih} x_t + b_{ih} + W_{hh} h_{t-1} + b_{hh}` split into four blocks:

    .. math::
        i_t = \sigma(z^{(i)}_t) \quad \text{input gate: how much new content to write}\\
        f_t = \sigma(z^{(f)}_t) \quad \text{forget gate: how much of the old cell to keep}\\
        g_t = \tanh(z^{(g)}_t) \quad \text{candidate content}\\
        o_t = \sigma(z^{(o)}_t) \quad \text{output gate: how much of the cell to expose}\\
        c_t = f_t \odot c_{t-1} + i_t \odot g_t, \qquad h_t = o_t \odot \tanh(c_t)

    The cell update is additive: when ``f_t`` is near 1 the gradient flows through ``c`` almost
    unchanged, which is how the LSTM eases the vanishing gradient.

    Args:
        input_size: features per time step, ``d_in``.
        hidden_size: size of ``h`` and ``c``, ``d_h``.
        forget_bias: added to the forget gate's ``bias_hh`` at initialisation; ``1.0`` (the
            recommendation of Jozefowicz et al., 2015) starts the cell in "remember" mode.
    """

    def __init__(self, input_size: int, hidden_size: int, forget_bias: float = 0.0):
        super().__init__()
        _check_sizes(input_size, hidden_size)
        self.input_size, self.hidden_size = input_size, hidden_size
        self.weight_ih = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        self.bias_ih = nn.Parameter(torch.empty(4 * hidden_size))
        self.bias_hh = nn.Parameter(torch.empty(4 * hidden_size))
        self.forget_bias = forget_bias
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's initialisation, plus ``forget_bias`` on the forget gate."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)
        with torch.no_grad():
            self.bias_hh[self.hidden_size : 2 * self.hidden_size] += self.forget_bias

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Run the LSTM over a sequence.

        Args:
            x: ``(batch, seq, input_size)``.
            state: ``(h0, c0)``, each ``(batch, hidden_size)``; zeros if ``None``.

        Returns:
            ``(outputs, (h_T, c_T))`` with outputs ``(batch, seq, hidden_size)``.
        """
        _check_input(x, self.input_size)
        batch = x.size(0)
        if state is None:
            h = c = x.new_zeros(batch, self.hidden_size)
        else:
            h, c = state
            for name, s in (("h0", h), ("c0", c)):
                if s.shape != (batch, self.hidden_size):
                    expected = f"(batch={batch}, {self.hidden_size})"
                    raise ValueError(f"{name} must have shape {expected}, got {tuple(s.shape)}")
        x_proj = x @ self.weight_ih.T + self.bias_ih  # (batch, seq, 4 * hidden), all steps at once
        outputs = []
        for t in range(x.size(1)):
            z = x_proj[:, t] + h @ self.weight_hh.T + self.bias_hh
            input_gate, forget_gate, candidate, output_gate = z.chunk(4, dim=-1)
            c = torch.sigmoid(forget_gate) * c + torch.sigmoid(input_gate) * torch.tanh(candidate)
            h = torch.sigmoid(output_gate) * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, dim=1), (h, c)

    @classmethod
    def from_torch(cls, reference: nn.LSTM) -> LSTM:
        """A copy of a single-layer, unidirectional, batch-first ``torch.nn.LSTM`` with biases."""
        _check_reference(reference, nn.LSTM)
        model = cls(reference.input_size, reference.hidden_size)
        _copy_weights(model, reference)
        return model


def _check_reference(reference: nn.Module, kind: type) -> None:
    if not isinstance(reference, kind):
        raise TypeError(f"reference must be a torch.nn.{kind.__name__}, got {type(reference).__name__}")
    unsupported = {
        "num_layers": reference.num_layers != 1,
        "bidirectional": reference.bidirectional,
        "bias=False": not reference.bias,
        "batch_first=False": not reference.batch_first,
        "proj_size": getattr(reference, "proj_size", 0) != 0,
    }
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise ValueError(f"only single-layer, unidirectional, batch-first modules with biases can be copied; got {bad}")


def _copy_weights(model: nn.Module, reference: nn.Module) -> None:
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(model, name).copy_(getattr(reference, f"{name}_l0"))
    model.to(reference.weight_ih_l0.device)


class RecurrentClassifier(nn.Module):
    """Embed tokens, run a recurrent network, classify from its last hidden state.

    Args:
        vocab_size: number of input token ids.
        n_classes: number of output classes.
        hidden_size: size of the recurrent state (the embedding has the same size).
        cell: ``"rnn"`` (a vanilla RNN) or ``"lstm"``.
        forget_bias: added to the LSTM's forget-gate bias at initialisation (ignored for
            ``"rnn"``); ``1.0`` is the value Jozefowicz et al. (2015) recommend.
        backend: ``"companion"`` runs :class:`RNN` / :class:`LSTM`, this module's loop over time
            in Python; ``"torch"`` runs ``torch.nn.RNN`` / ``torch.nn.LSTM``, the same equations
            with the loop in C++ (several times faster on a CPU for small hidden sizes). Both
            initialise their weights the same way (uniform in ``±1/sqrt(hidden_size)``).

    ``forward(tokens)`` maps ``(batch, seq)`` token ids to ``(batch, n_classes)`` logits;
    :meth:`classify` does the same from already embedded inputs ``(batch, seq, hidden_size)``.
    """

    def __init__(self, vocab_size: int, n_classes: int, hidden_size: int = 64, cell: str = "lstm",
                 forget_bias: float = 1.0, backend: str = "companion"):
        super().__init__()
        check_choice("cell", cell, ("rnn", "lstm"))
        check_choice("backend", backend, ("companion", "torch"))
        for name, value in (("vocab_size", vocab_size), ("n_classes", n_classes), ("hidden_size", hidden_size)):
            check_int(name, value, 1)
        self.cell, self.backend = cell, backend
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.recurrent: nn.Module
        if backend == "companion" and cell == "rnn":
            self.recurrent = RNN(hidden_size, hidden_size)
        elif backend == "companion":
            self.recurrent = LSTM(hidden_size, hidden_size, forget_bias)
        elif cell == "rnn":
            self.recurrent = nn.RNN(hidden_size, hidden_size, batch_first=True)
        else:
            self.recurrent = nn.LSTM(hidden_size, hidden_size, batch_first=True)
            with torch.no_grad():  # same layout as LSTM: gates stacked input, forget, candidate, output
                self.recurrent.bias_hh_l0[hidden_size : 2 * hidden_size] += forget_bias
        self.head = nn.Linear(hidden_size, n_classes)

    def classify(self, embedded: torch.Tensor) -> torch.Tensor:
        """``(batch, seq, hidden_size)`` embedded inputs -> ``(batch, n_classes)`` logits of the last state."""
        if not isinstance(embedded, torch.Tensor) or embedded.dim() != 3 or embedded.size(1) == 0:
            shape = tuple(embedded.shape) if isinstance(embedded, torch.Tensor) else type(embedded).__name__
            raise ValueError(f"embedded must have shape (batch, seq >= 1, hidden_size), got {shape}")
        outputs, _ = self.recurrent(embedded)
        return self.head(outputs[:, -1])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(batch, seq)`` token ids -> ``(batch, n_classes)`` logits, read from the last state."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape (batch, seq), got {tuple(tokens.shape)}")
        return self.classify(self.embedding(tokens))

    def input_gradient_norms(self, tokens: torch.Tensor, labels: torch.Tensor,
                             dtype: torch.dtype | None = None) -> torch.Tensor:
        r"""How much gradient reaches each input: :math:`\lVert \partial \ell_i / \partial x_{i,t} \rVert_2`.

        :math:`\ell_i` is the cross-entropy of example ``i`` and :math:`x_{i,t}` its embedded
        token at position ``t``. Back-propagation through time carries the gradient from the last
        state to :math:`x_{i,1}` through one Jacobian per step, :math:`\partial \ell_i/\partial
        x_{i,1} = \partial \ell_i/\partial h_T \prod_{t=2}^{T} (\partial h_t/\partial h_{t-1})\,
        \partial h_1/\partial x_{i,1}` (Bengio et al., 1994), so this measures how much of the
        learning signal survives the distance. The model's parameters and their ``.grad`` are
        left unchanged.

        Args:
            tokens: ``(batch, seq)`` token ids.
            labels: ``(batch,)`` class ids.
            dtype: compute on a copy of the model in this dtype (``torch.float64`` keeps
                gradients down to 1e-300 that float32 would round to zero); ``None``: as is.

        Returns:
            ``(batch, seq)`` gradient norms, detached.
        """
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            got = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"tokens must have shape (batch, seq), got {got}")
        if not isinstance(labels, torch.Tensor) or labels.shape != tokens.shape[:1]:
            got = tuple(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__
            raise ValueError(f"labels must have shape (batch={tokens.size(0)},), got {got}")
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype or None, got {dtype!r}")
        model = self if dtype is None else copy.deepcopy(self).to(dtype)
        with torch.enable_grad():
            embedded = model.embedding(tokens).detach().requires_grad_(True)
            # Summed, not averaged: example i's gradient is then exactly d loss_i / d x_i.
            loss = F.cross_entropy(model.classify(embedded), labels, reduction="sum")
            (grad,) = torch.autograd.grad(loss, embedded)
        return grad.norm(dim=-1)
