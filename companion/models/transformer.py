"""The original encoder-decoder Transformer (Vaswani et al., 2017), with greedy and beam-search decoding.

::

    src ids (batch, src_len) -> Embed · √d_model + PE -> Dropout -> TransformerEncoder -> memory
    tgt ids (batch, tgt_len) -> Embed · √d_model + PE -> Dropout -> TransformerDecoder(·, memory)
                             -> Linear tied to the target embedding -> logits (batch, tgt_len, tgt_vocab)

Defaults follow the paper's base model: sinusoidal positions, post-norm LayerNorm, ReLU FFN,
embeddings scaled by √d_model, the output projection sharing the target embedding's weights
(§3.4). ``share_embeddings=True`` also shares them with the source (one joint vocabulary, as
the paper's byte-pair vocabulary). Training is *teacher forcing*: the decoder reads the true
target shifted right (``<bos> y_1 … y_{n-1}``) and predicts ``y_1 … y_n <eos>`` at all positions
at once (:func:`teacher_forcing_loss`). Generation feeds the model its own predictions one token
at a time (:func:`greedy_decode`, :func:`beam_search`).

Decoding here re-runs the decoder over the whole prefix at each step (no KV cache): the
sequences of the book's tasks are short, and it keeps beam search readable.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import check_int
from companion.attention import padding_mask
from companion.blocks import FFN_KINDS, NORM_POSITIONS, TransformerDecoder, TransformerEncoder
from companion.normalization import NORMS
from companion.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

__all__ = ["MODEL_POSITIONS", "Transformer", "teacher_forcing_loss", "greedy_decode", "beam_search",
           "length_penalty"]

MODEL_POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "none")




def _check_ids(name: str, ids: object, vocab_size: int) -> Tensor:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
        got = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"{name} must be an integer tensor of shape (batch, seq), got {got}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{name} ids must lie in [0, {vocab_size}), got min {ids.min().item()}, max {ids.max().item()}")
    return ids


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al., 2017, Figure 1).

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (equal when ``share_embeddings``).
        d_model, n_heads, n_encoder_layers, n_decoder_layers, d_ff, dropout: the paper's base
            model is 512, 8, 6, 6, 2048, 0.1; the defaults here are CPU-sized.
        norm_position: ``"post"`` (paper) or ``"pre"``. norm: ``"layernorm"`` or ``"rmsnorm"``.
        ffn: ``"relu"``, ``"gelu"``, ``"silu"`` or ``"swiglu"``.
        position: ``"sinusoidal"`` (paper) or ``"learned"`` (added to the embeddings), ``"rope"``
            or ``"alibi"`` (inside self-attention), ``"none"``.
        share_embeddings: one embedding matrix for source and target.
        tie_output: the output projection reuses the target embedding matrix (paper §3.4).
        pad_id: padding id of both vocabularies; padded source keys are masked and padded target
            positions are ignored by :func:`teacher_forcing_loss`.
        max_len: rows of the learned position table (``position="learned"``) or of the initial
            sinusoidal table.
        final_norm: norm after each stack; default: only for pre-norm (see
            :class:`companion.blocks.TransformerEncoder`). ``torch.nn.Transformer`` always has one.
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, d_model: int = 64, n_heads: int = 4,
                 n_encoder_layers: int = 2, n_decoder_layers: int = 2, d_ff: int = 256, dropout: float = 0.1, *,
                 norm_position: str = "post", norm: str = "layernorm", ffn: str = "relu",
                 position: str = "sinusoidal", share_embeddings: bool = False, tie_output: bool = True,
                 pad_id: int = 0, max_len: int = 256, final_norm: bool | None = None) -> None:
        super().__init__()
        check_int("src_vocab_size", src_vocab_size, 2)
        check_int("tgt_vocab_size", tgt_vocab_size, 2)
        check_int("d_model", d_model)
        check_int("d_ff", d_ff)
        for name, value, choices in (("position", position, MODEL_POSITIONS), ("norm_position", norm_position, NORM_POSITIONS),
                                     ("norm", norm, NORMS), ("ffn", ffn, FFN_KINDS)):
            if value not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {value!r}")
        if share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(f"share_embeddings=True needs src_vocab_size == tgt_vocab_size, got "
                             f"{src_vocab_size} and {tgt_vocab_size}")
        if not 0 <= pad_id < min(src_vocab_size, tgt_vocab_size):
            raise ValueError(f"pad_id must be a valid id of both vocabularies, got {pad_id}")
        self.d_model, self.pad_id, self.position = d_model, pad_id, position
        self.src_vocab_size, self.tgt_vocab_size = src_vocab_size, tgt_vocab_size
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d_model)
        self.src_embed = self.tgt_embed if share_embeddings else nn.Embedding(src_vocab_size, d_model)
        # With the √d_model scaling, N(0, 1/d_model) embeddings enter the model at unit scale (as in fairseq).
        for emb in {id(self.src_embed): self.src_embed, id(self.tgt_embed): self.tgt_embed}.values():
            nn.init.normal_(emb.weight, std=d_model**-0.5)
        self.tie_output = tie_output
        self.out_proj = None if tie_output else nn.Linear(d_model, tgt_vocab_size, bias=False)
        self.pos: nn.Module | None = None
        if position == "sinusoidal":
            self.pos = SinusoidalPositionalEncoding(d_model, max_len)
        elif position == "learned":
            self.pos = LearnedPositionalEmbedding(max_len, d_model)
        stack_pos = position if position in ("rope", "alibi") else "none"
        common = dict(norm_position=norm_position, norm=norm, ffn=ffn, position=stack_pos, final_norm=final_norm)
        self.encoder = TransformerEncoder(n_encoder_layers, d_model, n_heads, d_ff, dropout, **common)
        self.decoder = TransformerDecoder(n_decoder_layers, d_model, n_heads, d_ff, dropout, **common)
        self.drop = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"position={self.position!r}, tie_output={self.tie_output}"

    def _embed(self, emb: nn.Embedding, ids: Tensor) -> Tensor:
        x = emb(ids) * math.sqrt(self.d_model)
        if self.pos is not None:
            x = self.pos(x)
        return self.drop(x)

    def source_mask(self, src: Tensor) -> Tensor:
        """Bool key mask ``(batch, 1, 1, src_len)``: True at real source tokens, False at padding."""
        return padding_mask(ids=src, pad_id=self.pad_id)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Source ids ``(batch, src_len)`` -> ``(memory (batch, src_len, d_model), source mask (batch, 1, 1, src_len))``."""
        _check_ids("src", src, self.src_vocab_size)
        mask = self.source_mask(src)
        return self.encoder(self._embed(self.src_embed, src), mask), mask

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor | None = None, need_weights: bool = False) -> Tensor:
        """Decoder input ids ``(batch, tgt_len)`` (starting with ``<bos>``) -> logits ``(batch, tgt_len, tgt_vocab)``.

        Position ``t`` sees decoder inputs ``0..t`` and the whole memory. Padded target positions
        need no mask: they come after the real ones, so causal attention never lets a real
        position see them, and the loss ignores their outputs.
        """
        _check_ids("tgt", tgt_in, self.tgt_vocab_size)
        if memory.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"source and target batch sizes differ: memory has {memory.shape[0]} rows, "
                             f"tgt has {tgt_in.shape[0]}")
        h = self.decoder(self._embed(self.tgt_embed, tgt_in), memory, memory_mask=src_mask, need_weights=need_weights)
        if self.out_proj is not None:
            return self.out_proj(h)
        return F.linear(h, self.tgt_embed.weight)  # tied: logit_v = h · e_v

    def forward(self, src: Tensor, tgt_in: Tensor, need_weights: bool = False) -> Tensor:
        """Logits ``(batch, tgt_len, tgt_vocab)`` for source ids ``(batch, src_len)`` and decoder inputs ``(batch, tgt_len)``."""
        _check_ids("src", src, self.src_vocab_size)
        _check_ids("tgt", tgt_in, self.tgt_vocab_size)
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"source and target batch sizes differ: src has shape {tuple(src.shape)}, "
                             f"tgt has shape {tuple(tgt_in.shape)}")
        memory, mask = self.encode(src)
        return self.decode(tgt_in, memory, mask, need_weights)

    def cross_attention_weights(self) -> list[Tensor | None]:
        """Per decoder layer, the cross-attention weights ``(batch, heads, tgt_len, src_len)`` of the last ``need_weights=True`` call."""
        return self.decoder.cross_attention_weights()


def teacher_forcing_loss(model: Transformer, batch: tuple[Tensor, Tensor], label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy of ``model(src, tgt[:, :-1])`` against ``tgt[:, 1:]``, ignoring padding.

    ``batch`` is ``(src (batch, src_len), tgt (batch, tgt_len))`` with ``tgt = <bos> y <eos> <pad>…``.
    The decoder input is the target shifted right by one, so position ``t`` predicts token
    ``t + 1`` having seen the true tokens ``0..t``. Usable as ``loss_fn`` of
    :func:`companion.training.train`. ``label_smoothing``: 0.1 in the paper.
    """
    src, tgt = batch
    logits = model(src, tgt[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt[:, 1:].reshape(-1),
                           ignore_index=model.pad_id, label_smoothing=label_smoothing)


def _check_decode_args(model: object, src: object, bos_id: int, eos_id: int, max_len: int) -> None:
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a companion Transformer, got {type(model).__name__}")
    _check_ids("src", src, model.src_vocab_size)
    check_int("max_len", max_len)
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < model.tgt_vocab_size:
            raise ValueError(f"{name} must be a target id in [0, {model.tgt_vocab_size}), got {value!r}")


@torch.no_grad()
def greedy_decode(model: Transformer, src: Tensor, bos_id: int, eos_id: int, max_len: int = 32) -> Tensor:
    """Generate by always taking the most probable next token.

    Args:
        model: a :class:`Transformer` (put in eval mode for the duration, then restored).
        src: source ids ``(batch, src_len)``.
        bos_id, eos_id: the target's start and end tokens.
        max_len: most tokens generated after ``<bos>``.

    Returns:
        ``(batch, ≤ max_len + 1)`` ids starting with ``<bos>``; after a sequence's ``<eos>`` the
        rest of its row is ``pad_id``. Stops early when every row has ended.
    """
    _check_decode_args(model, src, bos_id, eos_id, max_len)
    was_training = model.training
    model.eval()
    try:
        memory, mask = model.encode(src)
        out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            nxt = model.decode(out, memory, mask)[:, -1].argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, model.pad_id), nxt)
            out = torch.cat([out, nxt[:, None]], dim=1)
            done |= nxt == eos_id
            if done.all():
                break
        return out
    finally:
        model.train(was_training)


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's length normaliser ``((5 + length) / 6) ** alpha`` (Wu et al., 2016, eq. 14); 1 when ``alpha = 0``."""
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(model: Transformer, src: Tensor, bos_id: int, eos_id: int, beam_size: int = 4, max_len: int = 32,
                alpha: float = 0.6, return_scores: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Keep the ``beam_size`` best partial translations at every step; return the best finished one.

    A hypothesis' score is its total log-probability divided by :func:`length_penalty`
    (``alpha = 0``: plain log-probability, which favours short outputs; the paper uses beam 4,
    ``alpha = 0.6``). A hypothesis that emits ``eos_id`` is finished; the search stops once
    ``beam_size`` hypotheses are finished (or at ``max_len``, when the unfinished ones are scored
    as they are). ``beam_size=1`` is greedy decoding.

    Args:
        model, src, bos_id, eos_id, max_len: as :func:`greedy_decode`; ``src`` rows are searched
            one after another.
        beam_size: hypotheses kept per step.
        alpha: length-penalty exponent.
        return_scores: also return the best normalised score of each row ``(batch,)``.

    Returns:
        ``(batch, L)`` ids starting with ``<bos>``, right-padded with ``pad_id`` (and the scores).
    """
    _check_decode_args(model, src, bos_id, eos_id, max_len)
    check_int("beam_size", beam_size)
    was_training = model.training
    model.eval()
    try:
        best_rows, best_scores = [], []
        for row in range(src.shape[0]):
            memory, mask = model.encode(src[row : row + 1])
            beams = torch.full((1, 1), bos_id, dtype=torch.long, device=src.device)
            logp = torch.zeros(1, device=src.device)  # total log-probability of each live beam
            finished: list[tuple[float, Tensor]] = []
            for step in range(1, max_len + 1):
                k = beams.shape[0]
                logits = model.decode(beams, memory.expand(k, -1, -1), mask.expand(k, -1, -1, -1))[:, -1]
                cand = (logp[:, None] + logits.log_softmax(-1)).flatten()  # (k · vocab,)
                top, idx = cand.topk(min(2 * beam_size, cand.numel()))
                vocab = logits.shape[-1]
                keep_beams, keep_logp = [], []
                for score, i in zip(top.tolist(), idx.tolist()):
                    seq = torch.cat([beams[i // vocab], beams.new_tensor([i % vocab])])
                    if i % vocab == eos_id:
                        finished.append((score / length_penalty(step, alpha), seq))
                    else:
                        keep_beams.append(seq)
                        keep_logp.append(score)
                    if len(keep_beams) == beam_size:
                        break
                if len(finished) >= beam_size or not keep_beams:
                    break
                beams, logp = torch.stack(keep_beams), torch.tensor(keep_logp, device=src.device)
            if len(finished) < beam_size:  # ran out of length: score the live beams as they are
                finished += [(s / length_penalty(beams.shape[1] - 1, alpha), b) for s, b in zip(logp.tolist(), beams)]
            score, seq = max(finished, key=lambda f: f[0])
            best_rows.append(seq)
            best_scores.append(score)
        longest = max(len(s) for s in best_rows)
        out = torch.full((len(best_rows), longest), model.pad_id, dtype=torch.long, device=src.device)
        for r, s in enumerate(best_rows):
            out[r, : len(s)] = s
        scores = torch.tensor(best_scores)
        return (out, scores) if return_scores else out
    finally:
        model.train(was_training)
