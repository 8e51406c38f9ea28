"""Tokenizers, from characters to byte-level BPE and WordPiece: the trade-offs of Chapter 2, in code.

Four ways to turn text into integer ids:

- :class:`CharTokenizer`: one id per character (a thin wrapper around
  :class:`companion.data.CharVocab`, adding an ``<unk>`` id for characters never seen in training).
  Tiny vocabulary, long sequences.
- :class:`WordTokenizer`: one id per word or punctuation mark, ``<unk>`` for words outside the
  vocabulary. Short sequences, huge vocabulary, and out-of-vocabulary (OOV) words.
- :class:`BPETokenizer`: byte-level Byte-Pair Encoding (Sennrich et al., 2016; the byte-level
  variant of GPT-2, Radford et al., 2019). Start from the 256 bytes, so that any string can be
  encoded (no OOV, ever), then repeatedly merge the most frequent adjacent pair into a new token.
- :class:`WordPieceTokenizer`: BERT's WordPiece (Schuster & Nakajima, 2012; Devlin et al., 2019).
  Words are cut greedily into the longest vocabulary pieces, ``##`` marking a piece that continues
  a word; a word with a character the vocabulary lacks becomes ``[UNK]`` as a whole. Training
  merges the pair of units that most increases the likelihood of the training words.

The BPE trainer reproduces Hugging Face ``tokenizers``' ``BpeTrainer`` merge for merge (with the
``ByteLevel`` pre-tokenizer, ``add_prefix_space=False`` and the full byte alphabet as initial
alphabet), and :meth:`BPETokenizer.to_hf` exports a ``tokenizers.Tokenizer`` that encodes every
string to the same ids. See :meth:`BPETokenizer.train` for the tie-breaking rule. The WordPiece
tokenizer encodes to the same ids as HF's ``WordPiece`` model behind a ``BertPreTokenizer``
(:meth:`WordPieceTokenizer.to_hf` builds one); with a :class:`BertNormalizer` (lower-casing, accent
stripping, CJK and control characters) and :meth:`WordPieceTokenizer.from_tokenizer_json` it reads a
pre-trained BERT's ``tokenizer.json`` and encodes as that model's fast tokenizer does.

Where things are:

- :mod:`~companion.tokenization.pre_tokenization` — what happens before tokens: the regex patterns
  (:data:`GPT2_PATTERN`, :data:`GPT4_PATTERN`, :data:`PATTERNS`), :func:`split_words`, GPT-2's
  byte-to-character map (:func:`bytes_to_unicode`), BERT's pre-tokenizer (:func:`bert_pre_tokenize`)
  and normaliser (:class:`BertNormalizer`);
- :mod:`~companion.tokenization.characters` — :class:`CharTokenizer`;
- :mod:`~companion.tokenization.words` — :class:`WordTokenizer`;
- :mod:`~companion.tokenization.bpe` — :class:`BPETokenizer` (encoding, saving, HF export) and the
  textbook trainer :func:`train_bpe_naive`;
- :mod:`~companion.tokenization.bpe_training` — the incremental BPE trainer behind
  :meth:`BPETokenizer.train`, at parity with HF's ``BpeTrainer``;
- :mod:`~companion.tokenization.wordpiece` — :class:`WordPieceTokenizer` (encoding, ``tokenizer.json``
  import, HF export) and :data:`BERT_SPECIAL_TOKENS`;
- :mod:`~companion.tokenization.wordpiece_training` — the WordPiece trainer behind
  :meth:`WordPieceTokenizer.train` (``WORDPIECE_CRITERIA``, ``_likelihood_gain``);
- ``_common`` — private helpers the tokenizers share (input checks, special tokens, encoding cache).

Everything is importable from here, ``from companion.tokenization import BPETokenizer``.
"""

from companion.tokenization.bpe import BPETokenizer, train_bpe_naive
from companion.tokenization.characters import CharTokenizer
from companion.tokenization.pre_tokenization import (
    GPT2_PATTERN,
    GPT4_PATTERN,
    PATTERNS,
    BertNormalizer,
    bert_pre_tokenize,
    bytes_to_unicode,
    split_words,
)
from companion.tokenization.wordpiece import BERT_SPECIAL_TOKENS, WordPieceTokenizer
from companion.tokenization.wordpiece_training import WORDPIECE_CRITERIA as WORDPIECE_CRITERIA
from companion.tokenization.wordpiece_training import _likelihood_gain as _likelihood_gain
from companion.tokenization.words import WordTokenizer

__all__ = [
    "GPT2_PATTERN",
    "GPT4_PATTERN",
    "PATTERNS",
    "bytes_to_unicode",
    "split_words",
    "CharTokenizer",
    "WordTokenizer",
    "BPETokenizer",
    "train_bpe_naive",
    "BERT_SPECIAL_TOKENS",
    "bert_pre_tokenize",
    "BertNormalizer",
    "WordPieceTokenizer",
]
