"""The timing loop the benchmarks here share: the candidates run interleaved, round-robin, one call each per
round, so that drift in the machine's speed hits all of them alike; the device is synchronised around every
call; the result is each candidate's median over the timed rounds.  (Imported by the sibling scripts:
benchmarks/ is sys.path[0] when one of them runs.)"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import torch


def interleaved(cands: Mapping[str, Callable], repeats: int, warmup: int, device: torch.device,
                args: tuple = ()) -> dict[str, float]:
    """name -> median seconds of ``fn(*args)`` over ``repeats`` rounds, after ``warmup`` untimed rounds."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in cands}
    for r in range(warmup + repeats):
        for name, fn in cands.items():
            sync()
            t0 = time.perf_counter()
            fn(*args)
            sync()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}
