"""Run a function on N gloo processes (a ``file://`` rendezvous in a temporary folder), bounded in time.

``spawn_ranks(fn, world, *args, timeout=120)`` calls ``fn(rank, world, *args)`` in each spawned process inside
a process group and returns ``{rank: what fn returned}`` (``join=False``: ``fn(rank, world, init_method, *args)``
outside one, to join it itself); a rank's exception comes back as its traceback and
fails the caller, and a run past ``timeout`` seconds is killed and fails it too."""

from __future__ import annotations

import datetime
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank, world, tmp, fn, args, results, join):
    torch.set_num_threads(1)  # the ranks share the machine's cores: one thread each, not a pool each spinning
    try:
        if not join:  # fn joins the group itself, at this rendezvous (as train.py's run does under torchrun)
            results[rank] = fn(rank, world, f"file://{tmp}/rendezvous", *args)
            return
        dist.init_process_group(
            "gloo",
            init_method=f"file://{tmp}/rendezvous",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=60),
        )
        results[rank] = fn(rank, world, *args)
    except Exception:
        results[rank] = "ERROR " + traceback.format_exc()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn_ranks(fn, world: int, *args, timeout: float = 120.0, join: bool = True) -> dict:
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        ctx = mp.start_processes(
            _entry, args=(world, tmp, fn, args, results, join), nprocs=world, start_method="spawn", join=False
        )
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise AssertionError(f"{world} ranks did not finish within {timeout} s")
        results = dict(results)
    for rank in range(world):
        assert rank in results, f"rank {rank} returned nothing"
        assert not (isinstance(results[rank], str) and results[rank].startswith("ERROR ")), results[rank]
    return results
