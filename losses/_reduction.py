"""Reduction handling shared by the losses."""

from __future__ import annotations

REDUCTIONS = ("mean", "sum")


def check_reduction(owner: str, reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{owner}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return reduction
