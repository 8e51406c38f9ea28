"""Efficient inference: making a trained model cheaper to serve (Chapter 15).

* :mod:`~companion.inference.quantization` — int8 (per output channel) and group-wise int4 weights
  for ``nn.Linear``: :class:`QuantLinear`, :func:`quantize_model`, :func:`model_bytes`, and the
  quantize/dequantize/pack functions they are built from (checked against ``torchao``).
* :mod:`~companion.inference.speculative` — :func:`speculative_generate`, speculative decoding with
  a small draft model (the target's greedy tokens exactly; its distribution when sampling), and
  :func:`verify_draft`, the accept-or-resample step on its own.
* :mod:`~companion.inference.pruning` — magnitude (unstructured) pruning, and structured pruning of
  FFN neurons and attention heads that really shrinks ``d_ff`` and ``n_heads``.
* :mod:`~companion.inference.gqa` — :func:`to_gqa`, grouped-query (or multi-query) attention from a
  trained multi-head model by mean-pooling key/value heads (Ainslie et al., 2023).
"""

from companion.inference.gqa import pool_kv_heads, to_gqa
from companion.inference.pruning import (
    ffn_neuron_scores,
    head_scores,
    magnitude_masks,
    magnitude_prune,
    prune_ffn_neurons,
    prune_heads,
    sparsity_of,
)
from companion.inference.quantization import (
    QuantLinear,
    dequantize_int4,
    dequantize_int8,
    model_bytes,
    pack_int4,
    quantize_int4,
    quantize_int8,
    quantize_model,
    unpack_int4,
)
from companion.inference.speculative import SpeculativeStats, speculative_generate, verify_draft

__all__ = [
    "QuantLinear",
    "quantize_model",
    "model_bytes",
    "quantize_int8",
    "dequantize_int8",
    "quantize_int4",
    "dequantize_int4",
    "pack_int4",
    "unpack_int4",
    "speculative_generate",
    "verify_draft",
    "SpeculativeStats",
    "magnitude_masks",
    "magnitude_prune",
    "sparsity_of",
    "ffn_neuron_scores",
    "head_scores",
    "prune_ffn_neurons",
    "prune_heads",
    "to_gqa",
    "pool_kv_heads",
]
