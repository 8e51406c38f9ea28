"""The original encoder-decoder Transformer (Vaswani et al., 2017), built from the shared blocks.

::

    src ids (batch, src_len) -> Embed [· √d_model] -> encoder Stack (non-causal)  -> memory
    tgt ids (batch, tgt_len) -> Embed [· √d_model] -> decoder Stack (causal, cross-attention to memory)
                             -> output projection (tied to the target embedding) -> logits (batch, tgt_len, tgt_vocab)

``ModelConfig.preset("transformer-base")`` is the paper's base model: sinusoidal positions,
post-norm LayerNorm, ReLU FFN, embeddings scaled by √d_model, one 37,000-token vocabulary whose
embedding matrix is shared by source, target and output (§3.4). Give ``tgt_vocab_size`` for two
vocabularies (two embedding matrices; the output projection still reuses the target one when
``tie_embeddings``).

Training is *teacher forcing* (:func:`companion.training.teacher_forcing_loss`, also importable
from here): the decoder reads the true target
shifted right (``<bos> y_1 … y_{n-1}``) and predicts ``y_1 … y_n <eos>`` at all positions at
once. Generation (greedy, beam search) is in :mod:`companion.generation`; it passes the caches of
:meth:`Transformer.make_caches` so that each step runs the decoder on the new token only.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from companion.attention import KVCache, padding_mask
from companion.blocks import Stack
from companion.config import ModelConfig
from companion.initialization import init_weights
from companion.models.gpt import check_ids
from companion.training.losses import teacher_forcing_loss

__all__ = ["Transformer", "teacher_forcing_loss"]


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al., 2017, Figure 1).

    Args:
        config: a :class:`~companion.config.ModelConfig`; ``n_layers`` encoder blocks,
            ``n_decoder_layers`` (default the same) decoder blocks, ``vocab_size`` source ids and
            ``tgt_vocab_size`` target ids (None: one shared vocabulary and embedding matrix).
            ``pad_id`` marks padding: padded source keys are masked, padded targets ignored by the
            loss.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a companion ModelConfig, got {type(config).__name__}")
        self.config = config
        self.src_vocab_size = config.vocab_size
        self.tgt_vocab_size = config.tgt_vocab_size or config.vocab_size
        self.pad_id = config.pad_id
        self.src_embed = nn.Embedding(config.vocab_size, config.d_model)
        self.tgt_embed = self.src_embed if config.tgt_vocab_size is None else nn.Embedding(self.tgt_vocab_size,
                                                                                           config.d_model)
        self.encoder = Stack(config, config.n_layers, causal=False)
        self.decoder = Stack(config, config.n_decoder_layers or config.n_layers, causal=True, cross_attention=True)
        self.out_proj = None if config.tie_embeddings else nn.Linear(config.d_model, self.tgt_vocab_size, bias=False)
        init_weights(self, config, config.n_layers + (config.n_decoder_layers or config.n_layers),
                     {id(e): e for e in (self.src_embed, self.tgt_embed)}.values())

    def extra_repr(self) -> str:
        c = self.config
        return f"position={c.position!r}, norm_position={c.norm_position!r}, tie_embeddings={c.tie_embeddings}"

    def _embed(self, embedding: nn.Embedding, ids: Tensor) -> Tensor:
        x = embedding(ids)
        return x * math.sqrt(self.config.d_model) if self.config.scale_embeddings else x

    def source_mask(self, src: Tensor) -> Tensor:
        """Bool key mask ``(batch, 1, 1, src_len)``: True at real source tokens, False at padding."""
        return padding_mask(ids=src, pad_id=self.pad_id)

    def encode(self, src: Tensor, attention_mask: Tensor | None = None,
               need_weights: bool = False) -> tuple[Tensor, Tensor]:
        """Source ids ``(batch, src_len)`` -> ``(memory (batch, src_len, d_model), mask (batch, 1, 1, src_len))``.

        ``attention_mask`` ``(batch, src_len)``: 1 at real tokens, 0 at padding (HF's convention);
        default: every id that is not ``pad_id``.
        """
        check_ids("src", src, self.src_vocab_size)
        if attention_mask is None:
            mask = self.source_mask(src)
        elif not isinstance(attention_mask, Tensor) or attention_mask.shape != src.shape:
            got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise ValueError(f"attention_mask must have the shape of src {tuple(src.shape)}, got {got}")
        else:
            mask = attention_mask.bool()[:, None, None, :]
        return self.encoder(self._embed(self.src_embed, src), mask=mask, need_weights=need_weights), mask

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor | None = None, *, cache: KVCache | None = None,
               cross_cache: KVCache | None = None, need_weights: bool = False) -> Tensor:
        """Decoder input ids ``(batch, tgt_len)`` (starting with ``<bos>``) -> logits ``(batch, tgt_len, tgt_vocab)``.

        Position ``t`` sees decoder inputs ``0..t`` and the whole memory. Padded target positions
        need no mask: they come after the real ones, so causal attention never lets a real
        position see them, and the loss ignores their outputs. With ``cache`` (and
        ``cross_cache``, from :meth:`make_caches`) pass only the new tokens.
        """
        check_ids("tgt", tgt_in, self.tgt_vocab_size)
        if memory.dim() != 3 or memory.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"memory must have shape (batch={tgt_in.shape[0]}, src_len, d_model), "
                             f"got {tuple(memory.shape)}")
        h = self.decoder(self._embed(self.tgt_embed, tgt_in), cache=cache, memory=memory, memory_mask=src_mask,
                         cross_cache=cross_cache, need_weights=need_weights)
        return self.project(h)

    def project(self, h: Tensor) -> Tensor:
        """Decoder states ``(batch, tgt_len, d_model)`` -> logits ``(batch, tgt_len, tgt_vocab)``."""
        if self.out_proj is not None:
            return self.out_proj(h)
        return F.linear(h, self.tgt_embed.weight)  # tied: logit_v = h · e_v

    def forward(self, src: Tensor, tgt_in: Tensor, need_weights: bool = False, *,
                attention_mask: Tensor | None = None) -> Tensor:
        """Logits ``(batch, tgt_len, tgt_vocab)`` for source ids ``(batch, src_len)`` and decoder inputs
        ``(batch, tgt_len)``; ``attention_mask`` over the source as in :meth:`encode`."""
        if isinstance(src, Tensor) and isinstance(tgt_in, Tensor) and src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"source and target batch sizes differ: src has shape {tuple(src.shape)}, "
                             f"tgt has shape {tuple(tgt_in.shape)}")
        memory, mask = self.encode(src, attention_mask, need_weights=need_weights)
        return self.decode(tgt_in, memory, mask, need_weights=need_weights)

    def make_caches(self, batch_size: int, max_len: int, src_len: int) -> tuple[KVCache, KVCache]:
        """Empty ``(self-attention, cross-attention)`` caches of the decoder for ``batch_size`` sequences.

        ``max_len``: decoder tokens to hold (``<bos>`` + generated); ``src_len``: source positions.
        """
        c, weight = self.config, self.tgt_embed.weight
        n = c.n_decoder_layers or c.n_layers
        kw = dict(dtype=weight.dtype, device=weight.device)
        return (KVCache(n, batch_size, c.resolved_n_kv_heads, c.resolved_head_dim, max_len, **kw),
                KVCache(n, batch_size, c.resolved_n_kv_heads, c.resolved_head_dim, src_len, **kw))

    def cross_attention_weights(self) -> list[Tensor | None]:
        """Per decoder block, the cross-attention weights ``(batch, heads, tgt_len, src_len)`` of the last
        ``need_weights=True`` call."""
        return self.decoder.attention_weights("cross")
