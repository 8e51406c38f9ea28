"""T5: the text-to-text encoder-decoder (Raffel et al., 2020), on the shared blocks.

T5 is the encoder-decoder of :mod:`companion.models.transformer` with the choices its authors
settled on (``ModelConfig.preset("t5-small")``):

* pre-norm with an RMS norm — no mean subtraction, no bias — and no bias anywhere else;
* no absolute positions: a learned scalar bias per head and per bucket of relative distance
  (:class:`companion.positional.T5RelativePositionBias`), computed once per stack and shared by
  its layers — bidirectional buckets in the encoder, causal ones in the decoder — and none in
  cross-attention;
* unscaled attention scores (``attention_scale=1``: the ``1/√head_dim`` is folded into the
  initialisation of the query projection, :func:`companion.initialization.init_t5_weights`);
* one embedding matrix for source, target and output, and, since the output reuses it, the
  decoder's states scaled by ``d_model^−0.5`` before the projection;
* a ReLU FFN (T5 v1.1: gated-GELU, ``ffn="geglu"``).

Every task is text to text — ``"translate English to German: …"`` → ``"…"`` — so one model, one
loss and one decoding procedure serve classification, generation and translation alike.
Pre-training uses span corruption (:func:`companion.objectives.span_corrupt`).
"""

from __future__ import annotations

from torch import Tensor, nn

from companion.config import ModelConfig
from companion.initialization import init_t5_weights
from companion.models.transformer import Transformer

__all__ = ["T5"]


class T5(Transformer):
    """T5 (Raffel et al., 2020): an encoder-decoder with one shared vocabulary.

    Args:
        config: a :class:`~companion.config.ModelConfig` with ``tgt_vocab_size=None`` (one shared
            vocabulary), e.g. ``ModelConfig.preset("t5-small")`` or ``"t5-tiny"``.

    ``model(src, tgt_in, attention_mask=mask)`` returns logits ``(batch, tgt_len, vocab)``;
    ``attention_mask`` marks the source's real tokens with 1. Decoding (greedy, beam search, with
    caches) is :mod:`companion.generation`'s, starting from ``pad_id`` as T5 does.
    """

    def __init__(self, config: ModelConfig) -> None:
        if isinstance(config, ModelConfig) and config.tgt_vocab_size is not None:
            raise ValueError(f"T5 shares one vocabulary: tgt_vocab_size must be None, got {config.tgt_vocab_size}")
        super().__init__(config)
        if config.init_std is None:  # T5's own scheme; an explicit init_std keeps GPT-2's
            init_t5_weights(self, config, [self.src_embed], output=self.out_proj)

    def project(self, h: Tensor) -> Tensor:
        """Logits from decoder states; a tied projection first rescales by ``d_model^−0.5`` (as T5 does)."""
        if self.out_proj is None:
            h = h * self.config.d_model**-0.5
        return super().project(h)

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> T5:
        """A :class:`T5` with the weights of a ``transformers`` ``T5ForConditionalGeneration``.

        ReLU (T5) and gated-GELU (T5 v1.1) feed-forward networks are supported. The result is in
        eval mode, on the HF model's device and dtype.
        """
        from companion.models._hf import t5_from_hf

        return t5_from_hf(cls, hf_model)
