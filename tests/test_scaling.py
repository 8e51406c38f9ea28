"""Tests for companion.scaling: the power-law fit recovers known laws, N counts GPT-2's parameters."""

import math

import numpy as np
import pytest
import torch

from companion.config import ModelConfig
from companion.models.gpt import GPT
from companion.scaling import PowerLawFit, fit_power_law, kaplan_parameter_estimate, non_embedding_parameters
from companion.utils import count_parameters


def test_recovers_kaplans_law_exactly():
    sizes = [1e5, 1e6, 1e7, 1e8, 1e9]
    losses = [(8.8e13 / n) ** 0.076 for n in sizes]
    fit = fit_power_law(sizes, losses)
    assert isinstance(fit, PowerLawFit)
    assert fit.alpha == pytest.approx(0.076, rel=1e-9)
    assert fit.n_c == pytest.approx(8.8e13, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)
    assert max(abs(r) for r in fit.log_residuals) < 1e-12
    assert fit(1e7) == pytest.approx(losses[2], rel=1e-9)
    torch.testing.assert_close(fit(torch.tensor(sizes)), torch.tensor(losses, dtype=torch.float64))


def test_matches_numpy_polyfit_on_noisy_data():
    rng = np.random.default_rng(0)
    sizes = np.geomspace(1e3, 1e6, 6)
    losses = (3e8 / sizes) ** 0.12 * np.exp(rng.normal(0, 0.02, sizes.size))
    slope, intercept = np.polyfit(np.log(sizes), np.log(losses), 1)
    fit = fit_power_law(sizes.tolist(), torch.tensor(losses))
    assert fit.alpha == pytest.approx(-slope, rel=1e-9)
    assert fit.n_c == pytest.approx(math.exp(intercept / -slope), rel=1e-6)
    assert 0.9 < fit.r2 < 1.0
    assert fit.alpha == pytest.approx(0.12, abs=0.03)


def test_a_loss_that_rises_with_size_has_a_negative_exponent():
    fit = fit_power_law([10, 100, 1000], [1.0, 2.0, 4.0])
    assert fit.alpha < 0


@pytest.mark.parametrize("sizes, losses, message", [
    ([1, 2], [1.0], "same length"),
    ([5, 5, 5], [1.0, 2.0, 3.0], "two distinct"),
    ([10], [1.0], "two distinct"),
    ([0, 10], [1.0, 2.0], "sizes must be finite and > 0"),
    ([1, 10], [1.0, -2.0], "losses must be finite and > 0"),
    ([1, 10], [1.0, float("nan")], "losses must be finite"),
    ([[1, 2]], [[1.0, 2.0]], "1-D"),
    ([1, 10], [2.0, 2.0], "slope 0"),
])
def test_fit_rejects_bad_input(sizes, losses, message):
    with pytest.raises(ValueError, match=message):
        fit_power_law(sizes, losses)


def test_fit_rejects_non_numbers():
    with pytest.raises(TypeError, match="sizes"):
        fit_power_law("abc", [1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="losses"):
        fit_power_law([1, 2], [object(), object()])
    with pytest.raises(ValueError, match="n must be"):
        fit_power_law([1, 10], [2.0, 1.0])(0)


def test_gpt2_small_has_85_million_non_embedding_parameters():
    """GPT-2 small: 124,439,808 parameters, of which token (50257 x 768) and position (1024 x 768)
    embeddings are 39,383,808; per block 12 d^2 + 13 d, plus the final LayerNorm's 2 d."""
    with torch.device("meta"):
        model = GPT(ModelConfig.preset("gpt2-small"))
    d = 768
    assert count_parameters(model) == 124_439_808
    assert non_embedding_parameters(model) == 12 * (12 * d * d + 13 * d) + 2 * d == 85_056_000
    assert kaplan_parameter_estimate(12, 768) == 84_934_656  # biases and norms left out: 0.14% fewer


def test_the_output_projection_is_a_vocabulary_embedding_tied_or_not():
    config = ModelConfig.preset("tiny", vocab_size=100, d_model=32, max_len=16)
    tied, untied = GPT(config), GPT(config.replace(tie_embeddings=False))
    assert count_parameters(untied) == count_parameters(tied) + 100 * 32
    assert non_embedding_parameters(untied) == non_embedding_parameters(tied)
    rope = GPT(config.replace(position="rope"))
    assert non_embedding_parameters(rope) == count_parameters(rope) - 100 * 32
    assert non_embedding_parameters(tied) == count_parameters(tied) - 100 * 32 - 16 * 32


def test_non_embedding_parameters_of_other_models_and_errors():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3))
    assert non_embedding_parameters(model, [model[0]]) == 4 * 3 + 3
    with pytest.raises(ValueError, match="embeddings="):
        non_embedding_parameters(model)
    with pytest.raises(TypeError, match="model"):
        non_embedding_parameters("gpt")
    with pytest.raises(TypeError, match="embeddings"):
        non_embedding_parameters(model, ["tok"])
    with pytest.raises(ValueError, match="d_model"):
        kaplan_parameter_estimate(2, 0)
