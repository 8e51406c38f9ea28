"""Complete models assembled from companion's parts, one module per model.

For example :mod:`companion.models.causal_lm`, a small decoder-only (GPT-style) language model
whose positional scheme is a constructor argument.

Import a submodule explicitly (``from companion.models.causal_lm import CausalLM``) so that
importing ``companion.models`` stays cheap.
"""

__all__: list[str] = []
