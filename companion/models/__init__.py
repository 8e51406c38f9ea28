"""Complete models assembled from companion's shared parts, one module per model family.

* :mod:`companion.models.gpt` — :class:`~companion.models.gpt.GPT`, the decoder-only family
  (GPT-2 by default; Llama-style with RoPE, RMSNorm, SwiGLU, GQA), with ``from_hf``.
* :mod:`companion.models.transformer` — the original encoder-decoder Transformer.

Every model is built from one :class:`companion.config.ModelConfig` and the blocks of
:mod:`companion.blocks`; generation is in :mod:`companion.generation`. Import a submodule
explicitly (``from companion.models.gpt import GPT``) so that importing ``companion.models``
stays cheap.
"""

__all__: list[str] = []
