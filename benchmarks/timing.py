"""The timing loop the benchmarks here share: the candidates run interleaved, round-robin, one call each per
round, so that drift in the machine's speed hits all of them alike; the device is synchronised around every
call; the result is each candidate's median over the timed rounds.  (Imported by the sibling scripts:
benchmarks/ is sys.path[0] when one of them runs.)

``clock="cpu"`` times each call by the CPU time of the calling thread (``time.thread_time``) instead of the
wall clock: with torch on one thread (``--threads 1``) that is the work the call did, which other processes
on a shared machine inflate far less than its wall time (they still share caches and memory bandwidth).
``machine()`` is the line each script prints first: the CPU model, torch's threads, the clock, and the load
average when the run started, so every figure carries the conditions it was measured in."""
from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping

import torch

CLOCKS = ("wall", "cpu")


def interleaved(cands: Mapping[str, Callable], repeats: int, warmup: int, device: torch.device,
                args: tuple = (), clock: str = "wall") -> dict[str, float]:
    """name -> median seconds of ``fn(*args)`` over ``repeats`` rounds, after ``warmup`` untimed rounds."""
    now = check_clock(clock, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in cands}
    for r in range(warmup + repeats):
        for name, fn in cands.items():
            sync()
            t0 = now()
            fn(*args)
            sync()
            if r >= warmup:
                times[name].append(now() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def check_clock(clock: str, device: torch.device) -> Callable[[], float]:
    """The timer for ``clock``; "cpu" needs the CPU and torch on one thread (other threads' work is not counted)."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    if clock == "wall":
        return time.perf_counter
    if device.type != "cpu" or torch.get_num_threads() != 1:
        raise ValueError(f"--clock cpu measures the calling thread's CPU time: it needs the CPU and --threads 1 "
                         f"(device {device}, {torch.get_num_threads()} threads)")
    return time.thread_time


def cpu_model() -> str:
    """The CPU's model name (lscpu's), or the platform's processor string where /proc/cpuinfo has none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine(clock: str = "wall") -> str:
    """CPU model, torch threads, clock and the 1-minute load average (>= 1 per core means others were busy)."""
    load = f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"
    return (f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__} on {torch.get_num_threads()} "
            f"thread(s); clock: {clock} ({'CPU time of the calling thread' if clock == 'cpu' else 'wall time'}); "
            f"load average at start {load}")
