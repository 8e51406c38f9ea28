"""companion.training.distributed with two real gloo processes on the CPU."""

import datetime
import json
import socket

import torch.distributed as dist
import torch.multiprocessing as mp

from companion.training.distributed import from_rank_0


class Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.callback = lambda: None  # a lambda cannot be pickled


def _raise(kind):
    if kind == "key":
        raise KeyError("missing entry")
    if kind == "unpicklable":
        raise Unpicklable("holds a lambda")
    return {"step": 7}


def _worker(rank, world, port, folder):
    # a short timeout: a rank left waiting in a broadcast fails the test instead of hanging it
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    seen = {}
    try:
        for kind in ("ok", "key", "unpicklable"):
            try:
                seen[kind] = ["ok", from_rank_0(lambda kind=kind: _raise(kind), world)]
            except Exception as err:  # what each rank raises
                seen[kind] = [type(err).__name__, str(err)]
    finally:
        dist.destroy_process_group()
    (folder / f"rank{rank}.json").write_text(json.dumps(seen))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_from_rank_0_shares_results_and_every_error_without_hanging(tmp_path):
    """Rank 0's result reaches rank 1; any error on rank 0 (not only ValueError) makes both ranks
    raise instead of leaving rank 1 waiting in the broadcast; an error that cannot be pickled
    reaches the other rank as a RuntimeError that names it."""
    mp.spawn(_worker, args=(2, _free_port(), tmp_path), nprocs=2, join=True)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["ok"] == rank1["ok"] == ["ok", {"step": 7}]
    assert rank0["key"] == rank1["key"] == ["KeyError", "'missing entry'"]
    assert rank0["unpicklable"] == ["Unpicklable", "holds a lambda"]
    assert rank1["unpicklable"][0] == "RuntimeError" and "Unpicklable: holds a lambda" in rank1["unpicklable"][1]
