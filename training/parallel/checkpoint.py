"""A model-parallel run's checkpoint: one file, written atomically by rank 0, with the whole model and every rank's
own state, so that ``--resume`` continues the run bit for bit.

checkpoint.pt holds what a one-process run's holds (``storage/checkpoint.py``: ``models.manual`` is the whole GPT,
gathered from the shards after the round's evaluation, so sample.py reads it as any other), and, per rank r of the
world, exactly what that rank steps:

    model_parallel.settings       --tensor-parallel, --sequence-parallel, --pipeline-parallel, --schedule,
                                  --micro-batches, --zero and the world size it was written with
    model_parallel.params[r]      rank r's parameters as it holds them: its tensor-parallel shards, its pipeline
                                  stage (the last stage's copy of the tied table, ``head``, too), the copies of the
                                  replicated ones it stepped itself
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
checkpoint's, and a different one given, or another world size, is refused naming both values.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from ..config import TrainConfig, flag
from ..errors import UsageError
from .distributed import DistInfo

SETTINGS = ("tensor_parallel", "sequence_parallel", "pipeline_parallel", "pipeline_schedule", "micro_batches", "zero")


def split_settings(config: TrainConfig, world_size: int) -> dict:
    """The settings that decide each rank's state and the order of every sum: a resume must keep them all."""
    return {**{name: getattr(config, name) for name in SETTINGS}, "world_size": world_size}


def _words(settings: dict) -> str:
    return ", ".join(f"{flag(k)} {v}" if k != "world_size" else f"world size {v}" for k, v in settings.items())


def resume_settings(config: TrainConfig, ckpt: dict, world_size: int, path: Path) -> TrainConfig:
    """The config that continues ``ckpt`` on ``world_size`` processes: a model-parallel checkpoint's split settings
    adopted where not given; UsageError in one line naming the checkpoint's and this run's values where they differ,
    or where only one of the two is model-parallel."""
    saved = (ckpt.get("model_parallel") or {}).get("settings")
    if saved is None:
        if config.model_parallel:
            now = _words(split_settings(config, world_size))
            raise UsageError(f"--resume {path}: the checkpoint was written without model parallelism (world size "
                             f"{ckpt.get('world_size', 1)}), this run has {now}; its optimizer state is not cut "
                             f"into shards: resume it as it was trained")
        return config
    now = split_settings(config, world_size)
    # the values given are compared before the others are adopted: a mix of the two could be refused for itself
    differs = [k for k in now if (k in config.given or k == "world_size") and saved.get(k) != now[k]]
    if differs:
        old, new = _words({k: saved.get(k) for k in differs}), _words({k: now[k] for k in differs})
        raise UsageError(f"--resume {path}: the checkpoint was written with {old}, this run has {new}; a "
                         f"model-parallel checkpoint resumes with the split and world size it was written with")
    adopted = {k: v for k, v in saved.items() if k in SETTINGS and k not in config.given}
    if adopted:
        # the checkpoint's split stays on the model-parallel path even where its settings are all defaults
        config = config.replace(**adopted, given=config.given | {"zero"})
    return config


def _own_state(impl) -> dict:
    """This rank's parameters, optimizer and schedule state and random stream, as it holds them."""
    return {"params": {name: p.detach().clone() for name, p in impl.part.named_parameters()},
            "optimizer": (impl.zero if impl.zero is not None else impl.opt).state_dict(),
            "scheduler": impl.sched.state_dict() if impl.sched is not None else None,
            "rng": torch.get_rng_state()}


def sharded_state(impl, config: TrainConfig, info: DistInfo) -> dict:
    """What checkpoint.pt holds beyond a one-process run's (collective: every rank calls it); on rank 0 the
    entries that replace its ``optimizers`` and ``schedulers`` and add ``model_parallel``, {} on the others.  The
    whole model is gathered from the shards first, so ``models.manual`` is this step's."""
    impl._sync_model()
    every = [None] * info.world_size if info.is_main else None
    dist.gather_object(_own_state(impl), every, dst=0)
    if not info.is_main:
        return {}
    return {"optimizers": {"manual": [s["optimizer"] for s in every]},
            "schedulers": {"manual": [s["scheduler"] for s in every]} if impl.sched is not None else {},
            "model_parallel": {"settings": split_settings(config, info.world_size),
                               "params": [s["params"] for s in every], "rng": [s["rng"] for s in every]}}


def restore_sharded(impl, ckpt: dict, batch_gen: torch.Generator, rank: int, steps_per_round: int,
                    path: Path) -> None:
    """Load a model-parallel checkpoint into this rank's freshly built run: the whole model, then the rank's own
    parameters, optimizer state, schedule and random streams, each checked against what the rank holds first."""
    from ..storage.restore import _check_optimizer, _check_weights, _load
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
    _load(path, f"optimizers.manual[{rank}]", (impl.zero if impl.zero is not None else impl.opt).load_state_dict,
          ckpt["optimizers"]["manual"][rank])
    _check_optimizer(f"manual[{rank}]", impl.opt, ckpt["epoch"] * steps_per_round, path)
    if impl.sched is not None:
        _load(path, f"schedulers.manual[{rank}]", impl.sched.load_state_dict, ckpt["schedulers"]["manual"][rank])
    _load(path, f"model_parallel.rng[{rank}]", torch.set_rng_state, mp["rng"][rank])
    _load(path, "rng.batches", batch_gen.set_state, ckpt["rng"]["batches"])
    impl._stale = True  # the whole model is gathered again from the shards before it is next read
