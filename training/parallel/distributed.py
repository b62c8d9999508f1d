"""Running under torchrun: the process group, who does what, the data shard, and failing loudly.

torchrun starts one process per rank with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT in the environment; ``init_from_env`` joins the process group (gloo on the CPU,
NCCL with one GPU per local rank) and ``shutdown`` leaves it.  Every rank draws the same seeded
permutation; ``shard`` gives each rank its disjoint, contiguous part of each global batch, so the
ranks together see exactly the batches one process would.  Rank 0 alone writes files and prints.

When a rank raises, it records "rank R: <error>" in the rendezvous store before it exits; a rank
whose collective then fails (gloo reports the closed connection at once; every collective also has
the process group's timeout) reads that record and names the rank in its own error.  The store is
made here, before the process group, so that a rank whose start-up fails (a peer that failed first
and closed its connections while this one was still connecting) can read the record too.  A rank
that died without a word (SIGKILL) or stopped answering is found by ``silent_ranks``.
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

FAILURE_KEY = "handgrad/failed_rank"
STOPPING_KEY = "handgrad/stopping/"  # + rank: this rank saw the run fail and is stopping
_store: dist.Store | None = None  # the rendezvous store of this process's group, once it was reached


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: rank r of world_size (world_size 1: not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1 or dist.is_initialized()


SINGLE = DistInfo()


def torchrun_env() -> DistInfo | None:
    """The rank/world from torchrun's environment variables, or None when not launched by torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        return DistInfo(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)))
    except ValueError as e:
        raise ValueError(f"torchrun environment: RANK/WORLD_SIZE/LOCAL_RANK must be integers ({e})") from None


def init_from_env(
    device_type: str, timeout_s: float = 300.0, init_method: str | None = None, info: DistInfo | None = None
) -> tuple[DistInfo, torch.device | None]:
    """Join the process group: gloo on the CPU, NCCL on CUDA (device cuda:LOCAL_RANK).

    -> (info, the device this rank must use for CUDA, else None).  ``init_method`` defaults to torchrun's
    env:// rendezvous; tests pass a file:// path.
    """
    info = info or torchrun_env()
    if info is None:
        raise RuntimeError("init_from_env: RANK and WORLD_SIZE are not set (launch with torchrun)")
    device = None
    if device_type == "cuda":
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    backend = "nccl" if device_type == "cuda" else "gloo"
    global _store
    timeout = datetime.timedelta(seconds=timeout_s)
    # What init_process_group(init_method=...) does itself, with the store kept (see the module's note).
    _store, _, _ = next(dist.rendezvous(init_method or "env://", info.rank, info.world_size, timeout=timeout))
    _store.set_timeout(timeout)
    device_id: dict[str, Any] = {"device_id": device} if device is not None else {}
    dist.init_process_group(
        backend,
        store=dist.PrefixStore("default_pg", _store),
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
        **device_id,
    )
    return info, device


def shutdown() -> None:
    global _store
    if dist.is_initialized():
        dist.destroy_process_group()
    _store = None


def shard(batch_idx: Tensor, info: DistInfo) -> Tensor:
    """This rank's part of a global batch: a contiguous slice, sizes differing by at most one.

    (The gradient of a mean over the global batch is restored exactly by weighting each rank's
    sum by 1 / global_batch, not by averaging per-rank means: see ``training.loop``.)
    """
    lo, hi = shard_bounds(batch_idx.shape[0], info)
    return batch_idx[lo:hi]


def shard_bounds(n: int, info: DistInfo) -> tuple[int, int]:
    """[lo, hi): this rank's contiguous part of n items."""
    return info.rank * n // info.world_size, (info.rank + 1) * n // info.world_size


def broadcast_(tensors: list[Tensor], src: int = 0) -> None:
    """Copy rank ``src``'s values of these tensors (parameters, buffers) to every rank, in one flat message."""
    if not tensors:
        return
    # float64 holds float32 values and integer counters (num_batches_tracked) exactly.
    flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])
    dist.broadcast(flat, src)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view(t.shape).to(t.dtype))
            offset += t.numel()


def all_reduce_sum_(t: Tensor) -> Tensor:
    """In place: the sum of ``t`` over every rank (evaluation's loss sums and correct counts)."""
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def _rendezvous_store(timeout_s: float) -> dist.Store:
    """The rendezvous store with a short timeout (it may live in a process that is gone); RuntimeError when there is
    none (each caller treats any failure to reach the store alike)."""
    store = _store
    if store is None and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
    if store is None:
        raise RuntimeError("no rendezvous store: the process group was never joined")
    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    return store


def report_failure(info: DistInfo, exc: BaseException) -> None:
    """Leave "rank R: error" in the rendezvous store, so the other ranks can name who failed."""
    try:
        store = _rendezvous_store(2.0)
        text = str(exc).splitlines()[0] if str(exc) else ""
        store.set(FAILURE_KEY, f"rank {info.rank}: {type(exc).__name__}: {text}")
    except Exception:  # the store itself may be gone: the local message still names this rank
        pass


def failed_peer(timeout_s: float = 2.0) -> str | None:
    """What a failed rank recorded, if it got to (None when it died without a word, e.g. SIGKILL)."""
    try:
        store = _rendezvous_store(timeout_s)
        if store.check([FAILURE_KEY]):
            return store.get(FAILURE_KEY).decode()
    except Exception:
        return None
    return None


def silent_ranks(info: DistInfo, grace_s: float = 2.0) -> list[int]:
    """The other ranks that have not said, within ``grace_s``, that they are stopping too: the ones killed,
    stopped or hung.  With two processes that is the other one; when the store cannot be asked, all others."""
    others = [r for r in range(info.world_size) if r != info.rank]
    if len(others) <= 1:
        return others
    try:
        store = _rendezvous_store(grace_s)
        store.set(f"{STOPPING_KEY}{info.rank}", "1")
        deadline = time.monotonic() + grace_s
        while True:
            silent = [r for r in others if not store.check([f"{STOPPING_KEY}{r}"])]
            if not silent or time.monotonic() > deadline:
                return silent or others
            time.sleep(0.05)
    except Exception:
        return others
