"""BERT: the encoder-only Transformer (Devlin et al., 2019), and DistilBERT's student (Sanh et al., 2019).

::

    ids (batch, seq), token_type_ids (batch, seq)
      -> token + segment embeddings, + learned positions, LayerNorm, dropout     (the Stack adds the last three)
      -> n_layers × post-norm Block (bidirectional: every token sees every other)
      -> hidden (batch, seq, d_model)
           ├─ pooler: tanh(W · hidden[:, 0])            pooled (batch, d_model)  -> NSP logits (batch, 2)
           └─ MLM head: LayerNorm(GELU(W · hidden)) · Eᵀ + b                     -> logits (batch, seq, vocab)

An encoder sees the whole sequence at once, so it cannot be trained to predict the next token;
BERT is trained to fill in masked tokens (masked language modelling, :func:`companion.objectives.mlm_mask`)
and, in the original recipe, to tell whether sentence B followed sentence A (next-sentence
prediction). The MLM decoder is tied to the token embeddings. ``ModelConfig.preset("bert-base")``
has HF ``BertModel``'s 109,482,240 parameters (embeddings, 12 layers, pooler).

RoBERTa (Liu et al., 2019) is the same network trained differently — no NSP, dynamic masking,
byte-level BPE — so it is a configuration and a training loop, not another class. DistilBERT keeps
every other layer of a trained BERT as its initialisation (:func:`distil_student`) and learns from
the teacher's soft predictions (:func:`companion.objectives.distillation_loss`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion.blocks import Stack
from companion.config import ModelConfig
from companion.feedforward import activation
from companion.initialization import init_weights
from companion.models.gpt import check_ids
from companion.normalization import make_norm

__all__ = ["BertOutput", "BERT", "SequenceClassifier", "distil_student"]


@dataclass
class BertOutput:
    """What :class:`BERT` computes for a batch.

    Attributes:
        hidden: last layer's states ``(batch, seq, d_model)``.
        pooled: ``tanh(W · hidden[:, 0])``, the ``[CLS]`` summary ``(batch, d_model)``.
        mlm_logits: masked-LM logits ``(batch, seq, vocab_size)``.
        nsp_logits: next-sentence logits ``(batch, 2)`` (index 0: B follows A).
    """

    hidden: Tensor
    pooled: Tensor
    mlm_logits: Tensor
    nsp_logits: Tensor


class BERT(nn.Module):
    """BERT with its pre-training heads.

    Args:
        config: a :class:`~companion.config.ModelConfig` — ``ModelConfig.preset("bert-base")`` or
            ``"bert-tiny"``; ``type_vocab_size`` segment embeddings (0: none), post-norm,
            ``embedding_norm=True``. The presets initialise as BERT does (Hugging Face's
            ``BertPreTrainedModel``): every matrix and embedding from N(0, 0.02²), biases 0, no
            depth scaling of the residual projections (``residual_init_scale=False``), and no
            dropout inside the FFN (``ffn_dropout=0.0``).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a companion ModelConfig, got {type(config).__name__}")
        d = config.d_model
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, d)
        self.seg_emb = nn.Embedding(config.type_vocab_size, d) if config.type_vocab_size else None
        self.stack = Stack(config, config.n_layers, causal=False)
        self.pooler = nn.Linear(d, d)
        self.mlm_transform = nn.Linear(d, d)
        self.mlm_norm = make_norm(config.norm, d, config.norm_eps)
        self.mlm_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.nsp_head = nn.Linear(d, 2)
        init_weights(self, config, config.n_layers, [self.tok_emb])

    @property
    def layers(self) -> nn.ModuleList:
        """The model's :class:`~companion.blocks.Block` s."""
        return self.stack.layers

    def encode(self, ids: Tensor, token_type_ids: Tensor | None = None, attention_mask: Tensor | None = None,
               need_weights: bool = False) -> Tensor:
        """Hidden states ``(batch, seq, d_model)``: the encoder without its heads (cheaper for features)."""
        check_ids("ids", ids, self.config.vocab_size)
        x = self.tok_emb(ids)
        if self.config.scale_embeddings:
            x = x * self.config.d_model**0.5
        if self.seg_emb is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(ids)
            check_ids("token_type_ids", token_type_ids, self.config.type_vocab_size)
            if token_type_ids.shape != ids.shape:
                raise ValueError(f"token_type_ids must have the shape of ids {tuple(ids.shape)}, "
                                 f"got {tuple(token_type_ids.shape)}")
            x = x + self.seg_emb(token_type_ids)
        mask = None
        if attention_mask is not None:
            if not isinstance(attention_mask, Tensor) or attention_mask.shape != ids.shape:
                got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask)
                raise ValueError(f"attention_mask must have the shape of ids {tuple(ids.shape)}, got {got}")
            mask = attention_mask.bool()[:, None, None, :]  # 1 = real token (HF's convention)
        return self.stack(x, mask=mask, need_weights=need_weights)

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """Masked-LM logits ``(..., vocab_size)`` from hidden states: transform, norm, tied decoder."""
        h = self.mlm_norm(activation("gelu", self.mlm_transform(hidden)))
        return F.linear(h, self.tok_emb.weight, self.mlm_bias)

    def pool(self, hidden: Tensor) -> Tensor:
        """The pooled ``[CLS]`` state ``tanh(W · hidden[:, 0])`` ``(batch, d_model)``."""
        return torch.tanh(self.pooler(hidden[:, 0]))

    def forward(self, ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None) -> BertOutput:
        """Run the encoder and both heads.

        Args:
            ids: token ids ``(batch, seq)``, starting with ``[CLS]``.
            token_type_ids: 0 for sentence A, 1 for sentence B ``(batch, seq)``; default all 0.
            attention_mask: 1 at real tokens, 0 at padding ``(batch, seq)`` (HF's convention).
        """
        hidden = self.encode(ids, token_type_ids, attention_mask)
        pooled = self.pool(hidden)
        return BertOutput(hidden, pooled, self.mlm_logits(hidden), self.nsp_head(pooled))

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> BERT:
        """A :class:`BERT` with the weights of a ``transformers`` ``BertModel`` or ``BertForPreTraining``.

        From a bare ``BertModel`` the pre-training heads keep their fresh initialisation. The
        result is in eval mode, on the HF model's device and dtype.
        """
        from companion.models._hf import bert_from_hf

        return bert_from_hf(cls, hf_model)


class SequenceClassifier(nn.Module):
    """A classifier on top of a (pre-trained) :class:`BERT`: dropout and a linear layer on the pooled state.

    Args:
        bert: the encoder (fine-tuned with the head unless frozen by the caller).
        n_classes: output classes.
        dropout: on the pooled state (BERT: 0.1).
    """

    def __init__(self, bert: BERT, n_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        if not isinstance(bert, BERT):
            raise TypeError(f"bert must be a companion BERT, got {type(bert).__name__}")
        if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 2:
            raise ValueError(f"n_classes must be an int >= 2, got {n_classes!r}")
        self.bert = bert
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(bert.config.d_model, n_classes)

    def forward(self, ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        """Class logits ``(batch, n_classes)``."""
        hidden = self.bert.encode(ids, token_type_ids, attention_mask)
        return self.head(self.drop(self.bert.pool(hidden)))


def distil_student(teacher: BERT, keep_every: int = 2) -> BERT:
    """DistilBERT's student: the teacher with every ``keep_every``-th layer, initialised from them.

    Sanh et al. (2019) halve BERT's depth and initialise the student from the teacher by taking
    one layer out of two (layers 0, 2, 4, … here); embeddings, pooler and heads are copied. The
    student is a new model: training it does not touch the teacher.
    """
    if not isinstance(teacher, BERT):
        raise TypeError(f"teacher must be a companion BERT, got {type(teacher).__name__}")
    if isinstance(keep_every, bool) or not isinstance(keep_every, int) or keep_every < 1:
        raise ValueError(f"keep_every must be an int >= 1, got {keep_every!r}")
    kept = list(range(0, teacher.config.n_layers, keep_every))
    student = BERT(teacher.config.replace(n_layers=len(kept))).to(teacher.tok_emb.weight.device)
    state = {k: v for k, v in teacher.state_dict().items() if not k.startswith("stack.layers.")}
    for new, old in enumerate(kept):
        state.update({k.replace(f"stack.layers.{old}.", f"stack.layers.{new}.", 1): v
                      for k, v in teacher.state_dict().items() if k.startswith(f"stack.layers.{old}.")})
    student.load_state_dict(copy.deepcopy(state))
    return student
