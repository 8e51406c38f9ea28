"""Checkpoints that resume a run exactly: weights, optimizer, step and every random state.

A run stopped after step ``k`` and resumed from its checkpoint must continue as if it had never
stopped: same data order, same dropout masks, same optimizer moments. So a checkpoint holds the
model and optimizer state dicts, the step, the states of Python's, NumPy's and PyTorch's global
generators (CPU and CUDA) and of any ``torch.Generator`` the data pipeline uses. Learning-rate
schedules here are pure functions of the step, so the step is their whole state.

Writing is **atomic**: the checkpoint goes to a temporary file in the same folder, is flushed to
disk, then renamed over the old one — a crash mid-write leaves the previous checkpoint intact.
Loading uses ``torch.load(weights_only=True)``, which unpickles tensors and plain containers
only, never arbitrary code. Every checkpoint carries the SHA-256 of its contents (every tensor's
bytes and every value), checked when it is read: a truncated file, or one whose bytes changed on
disk (a single flipped bit included), raises a ``ValueError`` that says so.

A long run keeps **a folder of checkpoints**, one per saved step (``checkpoint-0000200.pt``):
:func:`checkpoint_path` names them, :func:`list_checkpoints` finds them, :func:`prune_checkpoints`
keeps the newest few, and :func:`read_latest_checkpoint` finds the newest one that reads —
a file cut short by a crash is reported and skipped, never trusted.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "rng_states",
    "set_rng_states",
    "checkpoint_path",
    "list_checkpoints",
    "prune_checkpoints",
    "read_checkpoint",
    "restore_checkpoint",
    "read_latest_checkpoint",
]

FORMAT = "companion-checkpoint-v1"


def _unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DistributedDataParallel (or similar) wrapper."""
    return getattr(model, "module", model)


def rng_states() -> dict[str, Any]:
    """The states of Python's, NumPy's and PyTorch's global generators (CPU, and CUDA or Apple's
    MPS if present: dropout on a GPU draws from the GPU's generator)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    if _mps_available():
        states["mps"] = torch.mps.get_rng_state()
    return states


def _mps_available() -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore global generator states taken by :func:`rng_states`."""
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    if "mps" in states and _mps_available():
        torch.mps.set_rng_state(states["mps"])


def _digest(state: Any) -> str:
    """SHA-256 of a checkpoint's contents: every tensor's dtype, shape and bytes, every other value's repr."""
    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            h.update(f"{x.dtype}{tuple(x.shape)}".encode())
            h.update(x.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        elif isinstance(x, dict):
            h.update(b"{")
            for key, value in x.items():
                h.update(repr(key).encode())
                walk(value)
            h.update(b"}")
        elif isinstance(x, (list, tuple)):
            h.update(b"[")
            for value in x:
                walk(value)
            h.update(b"]")
        else:
            h.update(repr(x).encode())

    walk(state)
    return h.hexdigest()


def _fsync_folder(folder: Path) -> None:
    if os.name == "posix":  # a folder cannot be opened for fsync on Windows
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _reason(err: Exception) -> str:
    """The first line of a loading error, without ``torch.load``'s advice to retry with
    ``weights_only=False`` (wrong for a corrupt file, unsafe for an untrusted one)."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if "weights_only" in first or not first:
        return type(err).__name__
    return f"{type(err).__name__}: {first}"


def save_checkpoint(path: str | os.PathLike, *, model: nn.Module | dict[str, Any], step: int,
                    optimizer: torch.optim.Optimizer | dict[str, Any] | None = None,
                    generators: dict[str, torch.Generator] | None = None,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint of a run after ``step`` optimizer steps, atomically; return its path.

    Args:
        path: the file to write (its folder is created).
        model: the model (a DDP wrapper is unwrapped), or its state dict (e.g. the full state dict
            gathered from a sharded model).
        step: optimizer steps done.
        optimizer: the optimizer (its moments and step counts are saved too), or its state dict.
        generators: named ``torch.Generator`` s of the data pipeline, e.g. ``{"data": g}``.
        extra: plain values to keep alongside (a configuration as a dict, a vocabulary, …).
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "format": FORMAT,
        "step": step,
        "model": model if isinstance(model, dict) else _unwrap(model).state_dict(),
        "optimizer": optimizer if isinstance(optimizer, dict) or optimizer is None else optimizer.state_dict(),
        "rng": rng_states(),
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
        "extra": extra or {},
    }
    state["sha256"] = _digest(state)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX and Windows: the old checkpoint until this instant
        _fsync_folder(path.parent)  # and the rename itself survives a power cut
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` without restoring anything.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        ValueError: the file is truncated, corrupt or not a checkpoint of this format.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # a truncated zip, a bad pickle, a foreign file
        raise ValueError(f"{path} is not a readable checkpoint (truncated or corrupt): {_reason(err)}") from err
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} checkpoint")
    stored = state.pop("sha256", None)  # absent from checkpoints written before it was added
    if stored is not None and _digest(state) != stored:
        raise ValueError(f"{path} is not a readable checkpoint (truncated or corrupt): its contents do not match "
                         "the SHA-256 stored with them")
    return state


def restore_checkpoint(state: dict[str, Any], *, model: nn.Module | None = None,
                       optimizer: torch.optim.Optimizer | None = None,
                       generators: dict[str, torch.Generator] | None = None, restore_rng: bool = True) -> None:
    """Restore what is given from a checkpoint's dict (:func:`read_checkpoint`): the weights into
    ``model``, the state into ``optimizer``, the named ``generators`` and (with ``restore_rng``)
    the global random states."""
    if model is not None:
        _unwrap(model).load_state_dict(state["model"])
    if optimizer is not None:
        if state["optimizer"] is None:
            raise ValueError("the checkpoint holds no optimizer state")
        optimizer.load_state_dict(state["optimizer"])  # onto the devices of the parameters
    for name, g in (generators or {}).items():
        if name not in state["generators"]:
            raise ValueError(f"the checkpoint holds no state for generator {name!r} "
                             f"(it has {sorted(state['generators'])})")
        g.set_state(state["generators"][name])
    if restore_rng:
        set_rng_states(state["rng"])


def load_checkpoint(path: str | os.PathLike, *, model: nn.Module | None = None,
                    optimizer: torch.optim.Optimizer | None = None,
                    generators: dict[str, torch.Generator] | None = None, restore_rng: bool = True,
                    map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` and restore what is given.

    :func:`read_checkpoint` then :func:`restore_checkpoint`. Returns the checkpoint's dict, whose
    ``"step"`` says where to resume and ``"extra"`` holds what was saved with it.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        ValueError: the file is truncated, corrupt or not a checkpoint of this format.
    """
    state = read_checkpoint(path, map_location)
    restore_checkpoint(state, model=model, optimizer=optimizer, generators=generators, restore_rng=restore_rng)
    return state


_NAME = re.compile(r"checkpoint-(\d+)\.pt")


def checkpoint_path(folder: str | os.PathLike, step: int) -> Path:
    """The file of the checkpoint after ``step`` steps in ``folder``: ``checkpoint-0000200.pt``."""
    return Path(folder) / f"checkpoint-{step:07d}.pt"


def list_checkpoints(folder: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every checkpoint file in ``folder``, oldest first (none: an empty list)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = ((_NAME.fullmatch(p.name), p) for p in folder.iterdir())
    return sorted((int(m.group(1)), p) for m, p in found if m)


def prune_checkpoints(folder: str | os.PathLike, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints in ``folder`` and any temporary file a crash
    left behind; return the paths deleted."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be an int >= 1, got {keep!r}")
    doomed = [p for _, p in list_checkpoints(folder)[:-keep]]
    doomed += sorted(Path(folder).glob("checkpoint-*.pt.*.tmp"))  # save_checkpoint's temporary files
    for p in doomed:
        p.unlink(missing_ok=True)
    return doomed


def read_latest_checkpoint(folder: str | os.PathLike,
                           map_location: str | torch.device = "cpu") -> tuple[dict[str, Any], Path, list[str]]:
    """Read the newest checkpoint in ``folder`` that reads (:func:`read_checkpoint`).

    Returns ``(state, path, skipped)``: ``skipped`` says, one line per file, which newer
    checkpoints were unreadable (truncated or corrupt) and passed over.

    Raises:
        FileNotFoundError: ``folder`` holds no checkpoint, or none that reads.
    """
    found = list_checkpoints(folder)
    if not found:
        raise FileNotFoundError(f"no checkpoint-*.pt in {folder}")
    skipped = []
    for _, path in reversed(found):
        try:
            return read_checkpoint(path, map_location), path, skipped
        except ValueError as err:
            skipped.append(str(err))
        except OSError as err:  # a folder where a file should be, a file deleted meanwhile
            skipped.append(f"{path} cannot be read: {type(err).__name__}: {err.strerror or err}")
    raise FileNotFoundError(f"no readable checkpoint in {folder}: " + "; ".join(skipped))
