"""A model-parallel run's checkpoint: one file, written atomically by rank 0, with the whole model and every rank's
own state, so that ``--resume`` continues the run bit for bit.

checkpoint.pt holds what a one-process run's holds (``storage/checkpoint.py``: ``models.manual`` is the whole GPT,
gathered from the shards after the round's evaluation, so sample.py reads it as any other), and, per rank r of the
world, exactly what that rank steps:

    model_parallel.settings       --tensor-parallel, --sequence-parallel, --pipeline-parallel, --schedule,
                                  --virtual-stages, --micro-batches, --zero and the world size it was written with
    model_parallel.params[r]      rank r's parameters as it holds them: its tensor-parallel shards, its pipeline
                                  stage or stages (the last stage's copy of the tied table, ``head``, too), the
                                  copies of the replicated ones it stepped itself
    optimizers.manual[r]          rank r's optimizer state: its shard under ZeRO (with the bucket layout
                                  ``ZeroOptimizer.load_state_dict`` checks), else the state of its parameters
    schedulers.manual[r]          rank r's learning-rate schedule (under ZeRO its groups are the shard's)
    model_parallel.rng[r]         rank r's torch random stream

Each rank's own tensors are stored, not cut again out of the whole model on resume: a copy a rank stepped itself
(a layer norm under tensor parallelism, the pipeline's ``head``) is restored with its own bits even if rounding
had moved it from rank 0's copy.  One file rather than a file per rank: it is replaced in one atomic rename and
sealed by one checksum, so a crash mid-write leaves the previous round's checkpoint whole for every rank at once,
never a set of files from two different rounds.  The price: rank 0 holds every rank's optimizer state while it
writes (``gather_object``), the memory ZeRO saves between writes.

A checkpoint resumes with the split it was written with: the settings a resumed run is not given are the
checkpoint's, and a different one given, or another world size, is refused naming both values
(training/config/resume.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from .distributed import DistInfo


def _own_state(impl) -> dict:
    """This rank's parameters, optimizer and schedule state and random stream, as it holds them."""
    return {
        "params": {name: p.detach().clone() for name, p in impl.part.named_parameters()},
        "optimizer": (impl.zero if impl.zero is not None else impl.opt).state_dict(),
        "scheduler": impl.sched.state_dict() if impl.sched is not None else None,
        "rng": torch.get_rng_state(),
    }


def sharded_state(impl, split: dict, info: DistInfo) -> dict:
    """What checkpoint.pt holds beyond a one-process run's (collective: every rank calls it); on rank 0 the
    entries that replace its ``optimizers`` and ``schedulers`` and add ``model_parallel``, {} on the others (``split``:
    the settings of the split, ParallelConfig.split()).  The whole model is gathered from the shards first, so
    ``models.manual`` is this step's."""
    impl._sync_model()
    every: list[Any] | None = [None] * info.world_size if info.is_main else None
    dist.gather_object(_own_state(impl), every, dst=0)
    if not info.is_main:
        return {}
    states = cast(list[dict], every)  # rank 0's list, each rank's state gathered into it
    return {
        "optimizers": {"manual": [s["optimizer"] for s in states]},
        "schedulers": {"manual": [s["scheduler"] for s in states]} if impl.sched is not None else {},
        "model_parallel": {
            "settings": {**split, "world_size": info.world_size},
            "params": [s["params"] for s in states],
            "rng": [s["rng"] for s in states],
        },
    }


def restore_sharded(impl, ckpt: dict, batch_gen: torch.Generator, rank: int, steps_per_round: int, path: Path) -> None:
    """Load a model-parallel checkpoint into this rank's freshly built run: the whole model, then the rank's own
    parameters, optimizer state, schedule and random streams, each checked against what the rank holds first."""
    from ..impls.state import _check_optimizer, _check_weights, _load
    from ..storage.checkpoint import _refuse

    mp = ckpt["model_parallel"]
    for part in ("params", "rng"):
        if not isinstance(mp.get(part), list) or len(mp[part]) <= rank:
            _refuse(path, f"'model_parallel.{part}' holds no state of rank {rank}")
    for part in ("optimizers", "schedulers") if impl.sched is not None else ("optimizers",):
        if not isinstance(ckpt[part].get("manual"), list) or len(ckpt[part]["manual"]) <= rank:
            _refuse(path, f"'{part}.manual' holds no state of rank {rank}")
    _check_weights("manual", impl.model.state_dict(), ckpt["models"]["manual"], path)
    _load(path, "models.manual", impl.model.load_state_dict, ckpt["models"]["manual"])
    own, saved = dict(impl.part.named_parameters()), mp["params"][rank]
    where = f"model_parallel.params[{rank}]"
    if not isinstance(saved, dict) or saved.keys() != own.keys():
        _refuse(path, f"'{where}' does not hold this rank's parameters ({', '.join(list(own)[:3])}, ...)")
    for name, p in own.items():
        if not isinstance(saved[name], torch.Tensor) or saved[name].shape != p.shape:
            _refuse(path, f"'{where}.{name}' is not a tensor of this rank's shape {tuple(p.shape)}")
    with torch.no_grad():
        for name, p in own.items():  # in place: ZeRO's flat copy and the pipeline's shared tensors stay the ones used
            p.copy_(saved[name])
    _load(
        path,
        f"optimizers.manual[{rank}]",
        (impl.zero if impl.zero is not None else impl.opt).load_state_dict,
        ckpt["optimizers"]["manual"][rank],
    )
    _check_optimizer(f"manual[{rank}]", impl.opt, ckpt["epoch"] * steps_per_round, path)
    if impl.sched is not None:
        _load(path, f"schedulers.manual[{rank}]", impl.sched.load_state_dict, ckpt["schedulers"]["manual"][rank])
    _load(path, f"model_parallel.rng[{rank}]", torch.set_rng_state, mp["rng"][rank])
    _load(path, "rng.batches", batch_gen.set_state, ckpt["rng"]["batches"])
    impl._stale = True  # the whole model is gathered again from the shards before it is next read
