import pytest
import torch
from torch import nn

from companion.recurrent import LSTM, RNN, RecurrentClassifier


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_rnn_matches_torch_rnn_with_copied_weights(nonlinearity):
    torch.manual_seed(0)
    reference = nn.RNN(5, 7, nonlinearity=nonlinearity, batch_first=True)
    ours = RNN.from_torch(reference)
    x, h0 = torch.randn(3, 11, 5), torch.randn(3, 7)
    out, h_last = ours(x, h0)
    ref_out, ref_h = reference(x, h0[None])
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(h_last, ref_h[0])


def test_lstm_matches_torch_lstm_with_copied_weights_and_gradients():
    torch.manual_seed(0)
    reference = nn.LSTM(4, 6, batch_first=True)
    ours = LSTM.from_torch(reference)
    x = torch.randn(2, 9, 4, requires_grad=True)
    state = (torch.randn(2, 6), torch.randn(2, 6))
    out, (h, c) = ours(x, state)
    ref_out, (ref_h, ref_c) = reference(x, (state[0][None], state[1][None]))
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(c, ref_c[0])
    (grad_ours,) = torch.autograd.grad(out.sum(), x)
    (grad_ref,) = torch.autograd.grad(ref_out.sum(), x)
    torch.testing.assert_close(grad_ours, grad_ref)


def test_recurrence_is_causal():
    torch.manual_seed(0)
    for model in (RNN(3, 4), LSTM(3, 4)):
        x = torch.randn(1, 10, 3)
        changed = x.clone()
        changed[:, 6:] += 1.0
        assert torch.equal(model(x)[0][:, :6], model(changed)[0][:, :6])
        assert not torch.allclose(model(x)[0][:, 6:], model(changed)[0][:, 6:])


def test_lstm_forget_bias_initialisation():
    lstm = LSTM(3, 5, forget_bias=2.0)
    forget = lstm.bias_hh[5:10]
    assert forget.min() > 2.0 - 1 / 5**0.5 - 1e-6
    assert lstm.bias_hh[:5].abs().max() <= 1 / 5**0.5 + 1e-6


def test_vanishing_gradient_follows_the_spectral_radius():
    """In the linear regime |dh_T/dx_1| = rho^(T-1) |W_ih| for an orthogonal W_hh scaled by rho."""
    d = 8
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(0)))
    for rho in (0.5, 1.2):
        rnn = RNN(d, d)
        with torch.no_grad():
            rnn.weight_hh.copy_(rho * q)
            rnn.weight_ih.copy_(torch.eye(d))
            rnn.bias_ih.zero_()
            rnn.bias_hh.zero_()
        x = 1e-6 * torch.randn(1, 12, d, dtype=torch.float64)
        rnn.double()

        def last_state(x1, rnn=rnn, x=x):
            return rnn(torch.cat([x1[None, None], x[:, 1:]], 1))[1][0]

        jac = torch.autograd.functional.jacobian(last_state, x[0, 0])
        assert jac.norm().item() == pytest.approx(rho**11 * d**0.5, rel=1e-4)


def test_classifier_shapes_and_cells():
    tokens = torch.randint(0, 10, (4, 7))
    for cell in ("rnn", "lstm"):
        for backend in ("companion", "torch"):
            assert RecurrentClassifier(10, 3, hidden_size=8, cell=cell, backend=backend)(tokens).shape == (4, 3)


@pytest.mark.parametrize("cell", ["rnn", "lstm"])
def test_classifier_backends_compute_the_same_function(cell):
    torch.manual_seed(0)
    fast = RecurrentClassifier(10, 3, hidden_size=6, cell=cell, backend="torch")
    slow = RecurrentClassifier(10, 3, hidden_size=6, cell=cell, backend="companion")
    slow.embedding.load_state_dict(fast.embedding.state_dict())
    slow.head.load_state_dict(fast.head.state_dict())
    slow.recurrent = (RNN if cell == "rnn" else LSTM).from_torch(fast.recurrent)
    tokens = torch.randint(0, 10, (5, 12))
    torch.testing.assert_close(slow(tokens), fast(tokens))
    labels = torch.randint(0, 3, (5,))
    torch.testing.assert_close(slow.input_gradient_norms(tokens, labels), fast.input_gradient_norms(tokens, labels))


@pytest.mark.parametrize("backend", ["companion", "torch"])
def test_classifier_forget_bias_is_added_to_the_forget_gate_only(backend):
    torch.manual_seed(0)
    model = RecurrentClassifier(10, 3, hidden_size=5, cell="lstm", forget_bias=4.0, backend=backend)
    bias_hh = model.recurrent.bias_hh if backend == "companion" else model.recurrent.bias_hh_l0
    bound = 1 / 5**0.5 + 1e-6
    assert (bias_hh[5:10] > 4.0 - bound).all()
    assert bias_hh[:5].abs().max() <= bound and bias_hh[10:].abs().max() <= bound


def test_input_gradient_norms_match_autograd_per_example():
    torch.manual_seed(0)
    model = RecurrentClassifier(10, 4, hidden_size=6, cell="lstm", backend="torch")
    tokens, labels = torch.randint(0, 10, (3, 9)), torch.tensor([0, 3, 1])
    norms = model.input_gradient_norms(tokens, labels)
    assert norms.shape == (3, 9) and not norms.requires_grad
    for i in range(3):  # one example at a time, with the mean loss of a batch of one
        embedded = model.embedding(tokens[i : i + 1]).detach().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(model.classify(embedded), labels[i : i + 1])
        (grad,) = torch.autograd.grad(loss, embedded)
        torch.testing.assert_close(norms[i], grad[0].norm(dim=-1))
    assert all(p.grad is None for p in model.parameters())  # the parameters' gradients are untouched


def test_input_gradient_norms_in_float64_see_what_float32_rounds_to_zero():
    """A vanilla RNN with small recurrent weights: the gradient reaching the first token vanishes."""
    torch.manual_seed(0)
    model = RecurrentClassifier(10, 4, hidden_size=8, cell="rnn", backend="torch")
    with torch.no_grad():
        model.recurrent.weight_hh_l0.mul_(0.1)
    tokens, labels = torch.randint(0, 10, (2, 60)), torch.tensor([1, 2])
    single = model.input_gradient_norms(tokens, labels)
    double = model.input_gradient_norms(tokens, labels, dtype=torch.float64)
    assert double.dtype == torch.float64 and model.head.weight.dtype == torch.float32  # the model is not changed
    assert (single[:, 0] == 0).all() and (double[:, 0] > 0).all()
    torch.testing.assert_close(double[:, -1].float(), single[:, -1], rtol=1e-4, atol=1e-7)
    # The gradient shrinks geometrically with the distance to the output.
    assert (double[:, 0] < 1e-30 * double[:, -1]).all()


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="hidden_size"):
        RNN(3, 0)
    with pytest.raises(ValueError, match="input_size"):
        LSTM(-1, 4)
    with pytest.raises(ValueError, match="nonlinearity"):
        RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match=r"\(batch, seq, input_size=3\)"):
        RNN(3, 4)(torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match=r"\(batch, seq, input_size=3\)"):
        LSTM(3, 4)(torch.randn(5, 3))
    with pytest.raises(ValueError, match="seq = 0"):
        RNN(3, 4)(torch.randn(2, 0, 3))
    with pytest.raises(ValueError, match="h0"):
        RNN(3, 4)(torch.randn(2, 5, 3), torch.randn(3, 4))
    with pytest.raises(ValueError, match="c0"):
        LSTM(3, 4)(torch.randn(2, 5, 3), (torch.randn(2, 4), torch.randn(2, 5)))
    with pytest.raises(TypeError, match="nn.LSTM"):
        LSTM.from_torch(nn.RNN(3, 4, batch_first=True))
    with pytest.raises(ValueError, match="num_layers"):
        RNN.from_torch(nn.RNN(3, 4, num_layers=2, batch_first=True))
    with pytest.raises(ValueError, match="batch_first"):
        LSTM.from_torch(nn.LSTM(3, 4))
    with pytest.raises(ValueError, match="cell"):
        RecurrentClassifier(10, 3, cell="gru")
    with pytest.raises(ValueError, match="backend"):
        RecurrentClassifier(10, 3, backend="cudnn")
    with pytest.raises(ValueError, match="hidden_size"):
        RecurrentClassifier(10, 3, hidden_size=0)
    with pytest.raises(ValueError, match=r"\(batch, seq\)"):
        RecurrentClassifier(10, 3)(torch.randint(0, 10, (7,)))
    with pytest.raises(ValueError, match="embedded"):
        RecurrentClassifier(10, 3, hidden_size=4).classify(torch.randn(2, 0, 4))
    model, tokens = RecurrentClassifier(10, 3, hidden_size=4), torch.randint(0, 10, (2, 5))
    with pytest.raises(ValueError, match="labels"):
        model.input_gradient_norms(tokens, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="tokens"):
        model.input_gradient_norms(tokens[0], torch.tensor([0]))
    with pytest.raises(TypeError, match="dtype"):
        model.input_gradient_norms(tokens, torch.tensor([0, 1]), dtype=torch.int64)
