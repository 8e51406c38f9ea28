"""GPT: the decoder-only Transformer (Radford et al., 2018, 2019), and its Llama-style variants.

The whole model, nanoGPT-style::

    ids (batch, seq)
      -> token embedding                          (batch, seq, d_model)
      -> Stack (causal):  [+ learned positions]   GPT-2; RoPE / ALiBi / T5 act inside attention
                          n_layers × Block         x = x + Attn(Norm(x));  x = x + FFN(Norm(x))
                          final Norm
      -> LM head (the embedding matrix, tied)     logits (batch, seq, vocab_size)

Position ``t``'s logits predict token ``t + 1`` from tokens ``0 … t``: one objective, next-token
prediction, trains the model on every position of every sequence at once. The default
configuration is GPT-2's (learned positions, pre-norm LayerNorm, tanh-GELU, biases, tied input
and output embeddings as one shared ``Parameter``); RoPE, RMSNorm, SwiGLU, GQA and no biases give
a Llama-style model (``ModelConfig.preset("llama-tiny")``); ``config.sliding_window`` adds Mistral's
local attention (each token sees its last ``sliding_window`` tokens) and ``config.rope_scaling``
stretches RoPE beyond the trained length. :meth:`GPT.from_hf` loads Hugging Face
``GPT2LMHeadModel``, ``LlamaForCausalLM`` and ``MistralForCausalLM`` weights; with internet
access, real GPT-2 is::

    from transformers import GPT2LMHeadModel
    model = GPT.from_hf(GPT2LMHeadModel.from_pretrained("gpt2"))

Generation lives in :mod:`companion.generation`; pass a cache from :meth:`GPT.make_cache` to
decode one token at a time without recomputing the prefix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import check_int, tracing
from companion.attention import KVCache, RollingKVCache, StaticKVCache
from companion.blocks import Stack
from companion.config import ModelConfig
from companion.initialization import init_weights

__all__ = ["GPT", "CausalClassifier", "check_ids"]


def check_ids(name: str, ids: object, vocab_size: int) -> Tensor:
    """``ids`` if it is an integer tensor ``(batch, seq)`` of ids in ``[0, vocab_size)``.

    The range check reads the ids (a host sync): it is skipped under ``torch.compile``
    (:func:`companion._validation.tracing`).
    """
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
        got = f"shape {tuple(ids.shape)}, dtype {ids.dtype}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be an integer tensor of shape (batch, seq), got {got}")
    if ids.numel() and not tracing() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"{name} must lie in [0, {vocab_size}), got min {int(ids.min())}, max {int(ids.max())}")
    return ids


class GPT(nn.Module):
    """A decoder-only language model: next-token logits for every position.

    Args:
        config: a :class:`~companion.config.ModelConfig` (``ModelConfig.preset("gpt2-small")`` for
            GPT-2's size, ``"tiny"`` for a CPU-sized one).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a companion ModelConfig, got {type(config).__name__}")
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.stack = Stack(config, config.n_layers, causal=True)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        init_weights(self, config, config.n_layers, [self.tok_emb])
        if config.tie_embeddings:
            self.head.weight = self.tok_emb.weight  # one Parameter, counted once (Press & Wolf, 2017)

    def extra_repr(self) -> str:
        return f"position={self.config.position!r}, tie_embeddings={self.config.tie_embeddings}"

    @property
    def layers(self) -> nn.ModuleList:
        """The model's :class:`~companion.blocks.Block` s."""
        return self.stack.layers

    def hidden_states(self, ids: Tensor, *, attention_mask: Tensor | None = None, mask: Tensor | None = None,
                      cache: KVCache | None = None, positions: Tensor | None = None,
                      need_weights: bool = False) -> Tensor:
        """The last block's output after the final norm, ``(batch, seq, d_model)``: :meth:`forward` without the head."""
        check_ids("ids", ids, self.config.vocab_size)
        if cache is not None and not isinstance(cache, (KVCache, StaticKVCache, RollingKVCache)):
            raise TypeError(f"cache must be a KVCache, a StaticKVCache, a RollingKVCache or None, "
                            f"got {type(cache).__name__}")
        if isinstance(cache, RollingKVCache) and attention_mask is not None:
            raise ValueError("attention_mask (padding) is not supported with a RollingKVCache, whose ring drops the "
                             "old keys: use prompts of equal length, or a KVCache")
        if isinstance(cache, StaticKVCache) and attention_mask is not None:
            raise ValueError("attention_mask (padding) is not supported with a StaticKVCache, whose positions are "
                             "shared by the batch rows: use prompts of equal length, or a KVCache")
        if attention_mask is not None:
            expected = (ids.shape[0], (cache.seq_len() if cache is not None else 0) + ids.shape[1])
            if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != expected:
                got = getattr(attention_mask, "shape", type(attention_mask).__name__)
                raise ValueError(f"attention_mask must have shape (batch, past + seq) = {expected}, got {tuple(got)}")
            padding = attention_mask.bool()[:, None, None, :]  # (batch, 1, 1, keys): over heads and queries
            mask = padding if mask is None else mask & padding
        return self._hidden(ids, mask, cache, positions, need_weights)

    def _hidden(self, ids: Tensor, mask: Tensor | None, cache: KVCache | StaticKVCache | None, positions: Tensor | None,
                need_weights: bool) -> Tensor:
        # hidden_states without the input checks: generate() checks its inputs once, then calls this
        # at every step (a decoding step is short enough for the checks' reductions to show)
        x = self.tok_emb(ids)
        if self.config.scale_embeddings:  # the original Transformer's √d_model (Vaswani et al., 2017, §3.4)
            x = x * self.config.d_model**0.5
        return self.stack(x, mask=mask, positions=positions, cache=cache, need_weights=need_weights)

    def forward(self, ids: Tensor, *, attention_mask: Tensor | None = None, mask: Tensor | None = None,
                cache: KVCache | None = None, positions: Tensor | None = None, need_weights: bool = False) -> Tensor:
        """Logits ``(batch, seq, vocab_size)`` for token ids ``(batch, seq)``.

        Args:
            ids: token ids; with a ``cache``, only the new ones.
            attention_mask: ``(batch, past + seq)``, 1 (or True) at real tokens and 0 at padding
                (Hugging Face's convention); padded keys are never attended to.
            mask: an extra bool attention mask (True = may attend) broadcastable to ``(batch, heads,
                seq, past + seq)``, combined with the causal one (for local attention set
                ``config.sliding_window``).
            cache: a :class:`~companion.attention.KVCache` from :meth:`make_cache`; the new
                tokens' keys and values are appended and positions continue from its length. A
                :class:`~companion.attention.StaticKVCache` (``make_cache(..., static=True)``) needs
                ``positions`` ``(seq,)``: the new tokens are written there.
            positions: absolute positions of the tokens, ``(seq,)`` or ``(batch, seq)``; default
                ``past + arange(seq)``.
            need_weights: keep each block's attention weights (``block.self_weights``).
        """
        return self.head(self.hidden_states(ids, attention_mask=attention_mask, mask=mask, cache=cache,
                                            positions=positions, need_weights=need_weights))

    def make_cache(self, batch_size: int, max_len: int | None = None, *, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None, static: bool = False,
                   rolling: bool = False) -> KVCache | StaticKVCache | RollingKVCache:
        """An empty :class:`~companion.attention.KVCache` for this model.

        ``max_len`` (prompt + generated tokens) defaults to ``config.max_len``; dtype and device to
        the model's. ``static=True`` gives a :class:`~companion.attention.StaticKVCache`, whose
        fixed shapes a compiled decoding step needs (pass ``positions`` with it). ``rolling=True``
        (a model with ``config.sliding_window``) gives a :class:`~companion.attention.RollingKVCache`
        that keeps only the last ``sliding_window`` tokens, whatever the length (``max_len`` unused).
        """
        weight = self.tok_emb.weight
        c = self.config
        if rolling:
            if static or c.sliding_window is None:
                raise ValueError(f"rolling=True needs a model with config.sliding_window and static=False, got "
                                 f"sliding_window={c.sliding_window}, static={static}")
            return RollingKVCache(c.n_layers, batch_size, c.resolved_n_kv_heads, c.resolved_head_dim,
                                  c.sliding_window - 1, dtype=dtype or weight.dtype, device=device or weight.device)
        kind = StaticKVCache if static else KVCache
        return kind(c.n_layers, batch_size, c.resolved_n_kv_heads, c.resolved_head_dim, max_len or c.max_len,
                    dtype=dtype or weight.dtype, device=device or weight.device)

    def loss(self, ids: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
        """Mean next-token cross-entropy of ``self(ids)`` against ``targets`` ``(batch, seq)`` (nats)."""
        logits = self(ids)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore_index)

    # ----------------------------------------------------------------------------- Hugging Face

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> GPT:
        """A :class:`GPT` with the weights of a ``transformers`` GPT-2, Llama or Mistral causal LM.

        ``hf_model`` is a ``GPT2LMHeadModel``, ``LlamaForCausalLM`` or ``MistralForCausalLM``. The
        configuration is read from ``hf_model.config`` (Mistral's ``sliding_window``, Llama's
        ``"linear"`` and ``"dynamic"`` RoPE scaling included); settings this model does not
        implement (GPT-2's ``scale_attn_by_inverse_layer_idx``, other RoPE scalings, …) raise a
        ``ValueError``. The result is in eval mode, on the HF model's device and dtype.
        """
        from companion.models._hf import gpt_from_hf

        return gpt_from_hf(cls, hf_model)


class CausalClassifier(nn.Module):
    """A classifier on top of a (pre-trained) :class:`GPT`: a linear layer on one position's hidden state.

    GPT-1 fine-tunes by feeding the final block's state at the *last* token, the only position that
    has seen the whole input, to a linear layer (Radford et al., 2018, §3.2). ``position`` picks
    the token (``-1``, the last, by default; ``0`` sees only the first token, a control).

    Args:
        gpt: the decoder (fine-tuned with the head unless frozen by the caller).
        n_classes: output classes.
        position: index of the token whose state is classified, as in Python indexing.
    """

    def __init__(self, gpt: GPT, n_classes: int, position: int = -1) -> None:
        super().__init__()
        if not isinstance(gpt, GPT):
            raise TypeError(f"gpt must be a companion GPT, got {type(gpt).__name__}")
        check_int("n_classes", n_classes, 2)
        if isinstance(position, bool) or not isinstance(position, int):
            raise ValueError(f"position must be an int (a token index, -1 for the last), got {position!r}")
        self.gpt, self.position = gpt, position
        self.head = nn.Linear(gpt.config.d_model, n_classes)

    def forward(self, ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Class logits ``(batch, n_classes)`` for ids ``(batch, seq)``; ``attention_mask`` as :meth:`GPT.forward`."""
        if not -ids.shape[-1] <= self.position < ids.shape[-1]:
            raise ValueError(f"position {self.position} is outside sequences of length {ids.shape[-1]}")
        return self.head(self.gpt.hidden_states(ids, attention_mask=attention_mask)[:, self.position])
