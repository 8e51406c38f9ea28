"""Tests for companion.config: one validated configuration, published presets."""

import pytest

from companion.config import ModelConfig
from companion.models.gpt import GPT
from companion.models.transformer import Transformer
from companion.utils import count_parameters


def test_defaults_are_resolved_from_the_sizes():
    c = ModelConfig(vocab_size=10, d_model=48, n_heads=6)
    assert (c.resolved_head_dim, c.resolved_n_kv_heads, c.resolved_d_ff) == (8, 6, 192)
    assert c.replace(ffn="swiglu").resolved_d_ff == 128  # 8/3 * 48 = 128: equal parameters to 4 * d_model
    assert c.resolved_final_norm and not c.replace(norm_position="post").resolved_final_norm
    assert c.replace(head_dim=16).resolved_head_dim == 16


def test_presets_have_the_published_sizes():
    assert count_parameters(GPT(ModelConfig.preset("gpt2-small"))) == 124_439_808
    # Vaswani et al. (2017), Table 3, report ~65M for the base model with a shared vocabulary;
    # with 37,000 tokens our count is 63,082,496 (the vocabulary size is approximate in the paper).
    base = Transformer(ModelConfig.preset("transformer-base"))
    assert count_parameters(base) == 63_082_496
    assert ModelConfig.preset("tiny", position="rope").position == "rope"


@pytest.mark.parametrize("changes, match", [
    ({"vocab_size": 0}, "vocab_size must be an int >= 1, got 0"),
    ({"d_model": 30, "n_heads": 4}, "n_heads must divide d_model"),
    ({"n_kv_heads": 3}, "n_kv_heads must divide n_heads"),
    ({"position": "absolute"}, "position must be one of"),
    ({"norm": "batchnorm"}, "norm must be one of"),
    ({"norm_position": "sandwich"}, "norm_position must be one of"),
    ({"ffn": "tanh"}, "ffn must be one of"),
    ({"dropout": 1.0}, r"dropout must be a float in \[0, 1\)"),
    ({"norm_eps": 0}, "norm_eps must be a positive finite number"),
    ({"bias": 1}, "bias must be a bool"),
    ({"position": "rope", "d_model": 12, "n_heads": 4}, "head_dim must be even for position='rope'"),
    ({"position": "sinusoidal", "d_model": 15, "n_heads": 3}, "d_model must be even"),
    ({"pad_id": 10}, "pad_id must be an id of the vocabulary"),
    ({"position": "t5", "t5_num_buckets": 32, "t5_max_distance": 16}, "t5_max_distance must exceed"),
    ({"final_norm": "yes"}, "final_norm must be a bool or None"),
    ({"head_dim": 0}, "head_dim must be an int >= 1"),
])
def test_bad_fields_are_named(changes, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**{"vocab_size": 10, "d_model": 16, "n_heads": 4, **changes})


def test_unknown_preset_and_immutability():
    with pytest.raises(ValueError, match="name must be one of"):
        ModelConfig.preset("gpt5")
    c = ModelConfig.preset("tiny")
    with pytest.raises(AttributeError):
        c.d_model = 3  # frozen: a model's config cannot drift from its weights
    with pytest.raises(ValueError, match="n_layers must be an int >= 1"):
        c.replace(n_layers=0)


def test_bert_and_t5_fields_are_validated():
    with pytest.raises(ValueError, match="type_vocab_size must be an int >= 0"):
        ModelConfig(vocab_size=10, type_vocab_size=-1)
    with pytest.raises(ValueError, match="embedding_norm must be a bool"):
        ModelConfig(vocab_size=10, embedding_norm="yes")
