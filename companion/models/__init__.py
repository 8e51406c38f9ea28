"""Complete models assembled from companion's parts, one module per model.

* :mod:`companion.models.causal_lm`: a small decoder-only (GPT-style) language model whose
  positional scheme is a constructor argument (Chapter 6).
* :mod:`companion.models.transformer`: the original encoder-decoder Transformer, with greedy
  decoding and beam search (Chapter 9).

Import a submodule explicitly (``from companion.models.causal_lm import CausalLM``) so that
importing ``companion.models`` stays cheap.
"""

__all__: list[str] = []
