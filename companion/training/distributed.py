"""The few things a training script needs from ``torch.distributed`` (Li et al., 2020).

* :func:`setup` — join the process group ``torchrun`` describes in the environment (``gloo`` on
  CPU, ``nccl`` on CUDA, one GPU per process), or stay a single process;
* :func:`full_states` and :func:`load_full_states` — whole (unsharded) state dicts of a model and
  its optimizer, replicated (DDP) or sharded (FSDP2 ``fully_shard``), to save and load one file;
* :func:`any_process`, :func:`every_process` and :func:`from_rank_0` — agree on a flag, gather a
  small value, hand rank 0's value (or error) to every process.
"""

from __future__ import annotations

import os
import pickle

import torch
import torch.distributed as dist

__all__ = ["setup", "full_states", "load_full_states", "any_process", "every_process", "from_rank_0"]


def setup(device_arg: str | None) -> tuple[int, int, torch.device]:
    """(rank, world size, device); joins the process group when launched by torchrun."""
    use_cuda = torch.cuda.is_available() if device_arg is None else device_arg.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise ValueError(f"--device {device_arg}: no CUDA device is available here (use --device cpu)")
    if device_arg is not None and device_arg.startswith("mps") and not torch.backends.mps.is_available():
        raise ValueError(f"--device {device_arg}: Apple's MPS is not available here (use --device cpu)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, torch.device(device_arg or ("cuda" if use_cuda else "cpu"))
    local_rank = int(os.environ["LOCAL_RANK"])
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def full_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sharded: bool) -> tuple[dict, dict]:
    """Whole (unsharded) state dicts of the model and optimizer; with FSDP every process must call it."""
    if not sharded:
        return getattr(model, "module", model).state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def load_full_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a checkpoint written by an FSDP run into the sharded model and optimizer."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, state["model"], options=options)
    set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)


def any_process(flag: bool, world: int, device: torch.device) -> bool:
    """True on every process if ``flag`` is true on any (so that all stop after the same step)."""
    if world == 1:
        return flag
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def every_process(value: object, world: int) -> list:
    """``value`` of every process, in rank order."""
    if world == 1:
        return [value]
    values = [None] * world
    dist.all_gather_object(values, value)
    return values


def _sendable(err: BaseException) -> BaseException:
    """``err`` if it survives pickling (to travel to the other processes), else a RuntimeError
    that names it."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:  # an exception holding an unpicklable object (a lock, an open file)
        return RuntimeError(f"rank 0 failed: {type(err).__name__}: {err}")


def from_rank_0(compute, world: int):
    """``compute()`` on rank 0, its result given to every process; if it raised, every process
    raises (rank 0 its own error, the others the same error or a ``RuntimeError`` naming it). So
    only rank 0 touches the disk (a checkpoint folder need not be shared by the machines) and
    every process fails, or goes on, together: no rank is left waiting for a broadcast."""
    if world == 1:
        return compute()
    box, own = [None], None
    if dist.get_rank() == 0:
        try:
            box = [("ok", compute())]
        except Exception as err:  # any error: the other ranks must hear of it, not hang
            own = err
            box = [("error", _sendable(err))]
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise own if own is not None else value
    return value

