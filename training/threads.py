"""How many CPU threads torch's operations use, chosen from the machine's load when the user does not say.

torch starts one intra-op thread per core.  Its threads work in lock-step: each parallel operation waits for the
slowest of them, so when other processes keep the cores busy a step can take many times longer with one thread
per core than with one thread in all.  When ``--threads`` is not given, the count is the cores the 1-minute load
average leaves free (cores - load, rounded), at least one and at most torch's own default; ``$OMP_NUM_THREADS``
(torchrun sets it to 1 per process) is the user's choice and is kept.  The returned sentence says what was chosen
and why, for the start-up line.

Float32 sums over more or fewer threads round differently, so a run's last digits can depend on the count: give
``--threads N`` (or set $OMP_NUM_THREADS) for a run to repeat bit for bit, a resumed run too.
"""

from __future__ import annotations

import os

import torch


def machine_load() -> float | None:
    """The 1-minute load average (runnable processes, averaged), or None where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows; a system without /proc/loadavg
        return None


def choose_threads(
    requested: int | None, load: float | None = None, cores: int | None = None, default: int | None = None
) -> tuple[int, str]:
    """(threads, why): ``requested`` if given, else the cores ``load`` leaves free, within 1..``default``.

    ``load``, ``cores`` and ``default`` default to this machine's: os.getloadavg()'s first, os.cpu_count() and
    torch.get_num_threads() (one per core, or $OMP_NUM_THREADS)."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--threads {requested} is out of range (at least 1)")
        return requested, "--threads"
    default = torch.get_num_threads() if default is None else default
    if os.environ.get("OMP_NUM_THREADS"):
        return default, "$OMP_NUM_THREADS"
    load = machine_load() if load is None else load
    cores = (os.cpu_count() or 1) if cores is None else cores
    if load is None:
        return default, "one per core; no load average here"
    free = max(1, min(default, int(cores - load + 0.5)))
    if free == default:
        return free, f"one per core; load average {load:.2f} on {cores} cores"
    return free, (
        f"load average {load:.2f} on {cores} cores: more threads would wait on each other; --threads N to choose"
    )


def use_threads(requested: int | None) -> str:
    """Set torch's thread count as choose_threads says; -> "2 CPU threads, why" for the start-up line."""
    threads, why = choose_threads(requested)
    torch.set_num_threads(threads)
    count = f"{threads} CPU thread{'' if threads == 1 else 's'}"
    return count if why == "--threads" else f"{count}, {why}"
