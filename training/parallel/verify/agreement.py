"""Under torchrun every rank must run the same run: the ranks compare their settings and data before training.

A rank started with another ``--lr`` (or another ``--hidden``, or other data under the same name) would train
something else in lockstep with the others, or fail in a collective with a shape error, or hang.  So at start-up,
once the data is loaded, every rank sends every other rank what defines its run: each setting that is not
merely local to it (declared ``local``: paths, printing, the device index), the device type, the data's
fingerprint and the checkpoint it resumes.  These are a few hundred bytes, so the values themselves travel
(not a hash of them), and a disagreement stops every rank with the same line naming each field that differs
and every rank's value of it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ...errors import UsageError
from ...storage.fingerprint import difference
from ..distributed import DistInfo


class RanksDisagree(UsageError):
    """The ranks were started with different settings or data."""


def run_identity(settings: dict, device: torch.device, data_fingerprint: dict, ckpt: dict | None) -> dict:
    """What must be equal on every rank: ``settings`` (flag -> value, those not local to a rank), and the device
    type, data and checkpoint."""
    values = dict(settings)
    values["the device type"] = device.type
    values["the data"] = data_fingerprint
    values["the checkpoint resumed"] = (
        None if ckpt is None else f"sha256 {str(ckpt.get('sha256'))[:16]}... (epoch {ckpt['epoch']})"
    )
    return values


def check_ranks_agree(info: DistInfo, values: dict) -> None:
    """Exchange ``values`` between all ranks (a collective: every rank calls it); RanksDisagree on every rank if
    any differ.  Nothing to do in a single process."""
    if not info.enabled:
        return
    every: list[Any] = [None] * info.world_size  # each rank's values, once gathered
    dist.all_gather_object(every, values)
    differing = [name for name in values if any(other.get(name) != values[name] for other in every)]
    if differing:
        raise RanksDisagree(
            "the ranks disagree on "
            + "; ".join(_describe(name, every) for name in differing)
            + "; every rank must be started with the same settings and data"
        )


def _describe(name: str, every: list[dict]) -> str:
    if name == "the data":
        first = every[0].get(name) or {}
        for rank, other in enumerate(every[1:], start=1):
            differs = difference(first, other.get(name) or {})
            if differs is not None:
                return f"the data (rank 0 vs rank {rank}: {differs})"
    return f"{name} (" + ", ".join(f"rank {r}: {other.get(name)}" for r, other in enumerate(every)) + ")"
