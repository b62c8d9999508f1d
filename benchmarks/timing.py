"""What the benchmarks here share: the interleaved timing loop, and the options every script takes.

``interleaved``: the candidates run round-robin, one call each per round, so that drift in the machine's speed
hits all of them alike; the device is synchronised around every call; the result is each candidate's median
over the timed rounds.  ``machine``: the header line saying where a figure was measured.  ``parser``: an
argument parser with ``--threads`` (torch.set_num_threads, applied as the arguments are parsed) and
``--device`` (checked, one line where it does not exist here), whose errors are one line.  (Imported by the
sibling scripts: benchmarks/ is sys.path[0] when one of them runs.)
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


def machine(device: torch.device) -> str:
    """Where the figures below a benchmark's header were measured: torch, the device, the CPU and its threads."""
    gpu = f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    threads = torch.get_num_threads()
    return (f"torch {torch.__version__}, {device}{gpu}; CPU {cpu_name()}, {os.cpu_count()} cores, "
            f"{threads} thread{'' if threads == 1 else 's'}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as train.py's, not the usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


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


def parser(doc: str, device: bool = True) -> argparse.ArgumentParser:
    """The parser of a benchmark script described by ``doc`` (its first paragraph), with --threads and, unless
    ``device`` is False, --device (a torch.device once parsed)."""
    p = _Parser(description=doc.split("\n\n")[0])
    if device:
        p.add_argument("--device", type=_device, default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--threads", type=int, action=_SetThreads, default=None, metavar="N",
                   help=f"CPU threads for torch's operations (default: torch's choice, {torch.get_num_threads()} "
                        f"here); on a machine busy with other work, fewer can be many times faster")
    return p
