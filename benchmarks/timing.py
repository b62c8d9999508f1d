"""What the benchmarks here share: the interleaved timing loop, the header line, and the options every script takes.

``interleaved``: the candidates run round-robin, one call each per round, so that drift in the machine's speed
hits all of them alike; the device is synchronised around every call; the result is each candidate's median
over the timed rounds.  ``clock="cpu"`` times each call by the CPU time of the calling thread
(``time.thread_time``) instead of the wall clock: with torch on one thread (``--threads 1``) that is the work the
call did, which other processes on a shared machine inflate far less than its wall time (they still share caches
and memory bandwidth).  ``machine``: the header line saying where and under what load a figure was measured.
``parser``: an argument parser with ``--threads`` (torch.set_num_threads, applied as the arguments are parsed; not
given, chosen from the load by training.threads and printed), ``--device`` (checked, one line where it does not
exist here), ``--glibc-default`` (without it glibc's malloc keeps freed memory, as train.py has it:
training/allocator.py) and, for scripts that take it, ``--clock``; its errors are one line.  (Imported by the sibling
scripts: benchmarks/ is sys.path[0] when one of them runs.)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping

import torch

from training import UsageError, resolve_device
from training.allocator import retain_freed_memory
from training.threads import use_threads

CLOCKS = ("wall", "cpu")
MALLOC = "glibc's default"  # what the parsed command line made of malloc (the header says it)


def interleaved(
    cands: Mapping[str, Callable],
    repeats: int,
    warmup: int,
    device: torch.device,
    args: tuple = (),
    clock: str = "wall",
) -> dict[str, float]:
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
        raise ValueError(
            f"--clock cpu measures the calling thread's CPU time: it needs the CPU and --threads 1 "
            f"(device {device}, {torch.get_num_threads()} threads)"
        )
    return time.thread_time


def cpu_name() -> str:
    """The CPU's model name (lscpu's "Model name"), or what the platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine(device: torch.device, clock: str = "wall") -> str:
    """Where the figures below a benchmark's header were measured: torch, the device, the CPU and its threads, the
    clock, and the 1-minute load average at the start (>= 1 per core means other work was running)."""
    gpu = f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    threads = torch.get_num_threads()
    load = f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"
    what = "CPU time of the calling thread" if clock == "cpu" else "wall time"
    return (
        f"torch {torch.__version__}, {device}{gpu}; CPU {cpu_name()}, {os.cpu_count()} cores, "
        f"{threads} thread{'' if threads == 1 else 's'}; clock: {clock} ({what}); load average at start {load}; "
        f"malloc: {MALLOC}"
    )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as train.py's, not the usage block
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        ns = super().parse_args(args, namespace)
        global MALLOC
        # as train.py has it (training/allocator.py): a step's freed activations kept, not faulted back in next step
        ns.retained = False if ns.glibc_default else retain_freed_memory()
        MALLOC = "keeps freed memory (as train.py)" if ns.retained else "glibc's default"
        if getattr(ns, "threads", 0) is None:  # not given: as many as the load leaves cores free, said in one line
            print(f"threads: {use_threads(None)}")
            ns.threads = torch.get_num_threads()
        if getattr(ns, "clock", None) is not None:
            try:
                check_clock(ns.clock, getattr(ns, "device", torch.device("cpu")))
            except ValueError as e:
                self.error(str(e))
        return ns


class _SetThreads(argparse.Action):
    def __call__(self, parser, namespace, value, option_string=None):
        if value < 1:
            parser.error(f"--threads {value} is out of range (at least 1)")
        torch.set_num_threads(value)
        setattr(namespace, self.dest, value)


def _device(name: str) -> torch.device:
    try:
        return resolve_device(name)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parser(doc: str, device: bool = True, clock: bool = False) -> argparse.ArgumentParser:
    """The parser of a benchmark script described by ``doc`` (its first paragraph), with --threads, unless
    ``device`` is False --device (a torch.device once parsed), and with ``clock`` --clock wall|cpu."""
    p = _Parser(description=doc.split("\n\n")[0])
    if device:
        p.add_argument("--device", type=_device, default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument(
        "--threads",
        type=int,
        action=_SetThreads,
        default=None,
        metavar="N",
        help=f"CPU threads for torch's operations (default: the cores the load average leaves free, at "
        f"most {torch.get_num_threads()} here; printed at the start)",
    )
    p.add_argument(
        "--glibc-default",
        action="store_true",
        help="leave glibc's malloc as it is (by default it keeps freed memory, as train.py has it: "
        "training/allocator.py)",
    )
    if clock:
        p.add_argument(
            "--clock",
            choices=CLOCKS,
            default="wall",
            help="wall time (default), or the calling thread's CPU time (needs --threads 1): steadier on a "
            "machine others are using",
        )
    return p
