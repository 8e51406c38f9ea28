"""Synthetic tasks generated on the fly, seeded, with no downloads."""

from __future__ import annotations

import torch

__all__ = ["first_token_recall"]


def first_token_recall(
    n_samples: int,
    n_distractors: int,
    n_symbols: int = 8,
    n_noise: int = 8,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A long-range dependency task: remember the first token across ``n_distractors`` tokens.

    Each sequence is one *symbol* (ids ``0 .. n_symbols-1``) followed by ``n_distractors`` noise
    tokens (ids ``n_symbols .. n_symbols+n_noise-1``) and a final query token (the last id). The
    label is the first symbol, so a model that reads the sequence left to right must carry it
    across ``n_distractors + 1`` steps. Chance accuracy is ``1 / n_symbols``.

    Returns:
        ``(tokens, labels)``: ``(n_samples, n_distractors + 2)`` and ``(n_samples,)`` int64.
        The vocabulary size is ``n_symbols + n_noise + 1``.
    """
    for name, value, low in (("n_samples", n_samples, 1), ("n_distractors", n_distractors, 0),
                             ("n_symbols", n_symbols, 2), ("n_noise", n_noise, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    labels = torch.randint(n_symbols, (n_samples,), generator=generator)
    noise = torch.randint(n_symbols, n_symbols + n_noise, (n_samples, n_distractors), generator=generator)
    query = torch.full((n_samples, 1), n_symbols + n_noise)
    return torch.cat([labels[:, None], noise, query], dim=1), labels
