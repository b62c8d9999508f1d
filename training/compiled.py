"""``--compile``: the hand-written step compiled with torch.compile as one graph, its twin compiled as torch users do.

The hand-written step -- zero_grad, forward, loss, backward, optimizer step -- is plain tensor code with no autograd
graph in it, so torch.compile can take it whole (``fullgraph=True``: any graph break is an error, not a slow path)
and fuse its elementwise work across the layers and the update.  The twin is compiled the way PyTorch users compile
a model, ``torch.compile(model)``; autograd's backward and torch.optim's step run as they would.

Compiling takes time on the first steps (and again for a batch of a new shape, such as an epoch's smaller last one):
``CompileTimer`` times the calls during which the compiler made a graph apart from the others, so that a run reports
its compile time beside, not inside, its time per epoch or iteration.

What is compiled with the step: the in-place check of the layers (layers/saved.py) runs while the step compiles, the
range checks of class targets and token ids run as assertions inside the graph; the optimizers' hyper-parameters
are checked while tracing (the compiled step is guarded on them: a new value compiles again, checked again).
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from .config import TrainConfig, flag
from .cuda_graph import whole_step_blockers
from .errors import UsageError
from .parallel.distributed import SINGLE, DistInfo


def _graphs() -> int:
    from torch._dynamo.utils import counters  # here, not at import: torch._dynamo takes seconds to import
    return counters["stats"]["unique_graphs"]


class CompileTimer:
    """Calls ``fn``, which runs compiled code; ``seconds`` and ``graphs``: the time spent in the calls during which
    torch.compile made a graph (compiling, and running that step once) and how many graphs it made."""

    def __init__(self, fn: Callable, device: torch.device | None = None):
        self.fn = fn
        self.seconds, self.graphs = 0.0, 0
        self.sync = device if device is not None and device.type == "cuda" else None

    def __call__(self, *args):
        before, start = _graphs(), time.perf_counter()
        out = self.fn(*args)
        made = _graphs() - before
        if made:
            if self.sync is not None:
                torch.cuda.synchronize(self.sync)
            self.seconds += time.perf_counter() - start
            self.graphs += made
        return out


def compile_seconds(impl) -> float:
    """The compile time an implementation has spent so far (0 for one that is not compiled)."""
    timer = getattr(impl, "compiled", None)
    return 0.0 if timer is None else timer.seconds


def round_seconds(impl, device: torch.device, start: float, compiled_before: float) -> tuple[float, float]:
    """(seconds of a round's steps, seconds its steps spent compiling) for a round that began at ``start``
    (time.perf_counter()) with ``compiled_before = compile_seconds(impl)``; a CUDA device is waited for first."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    compiling = compile_seconds(impl) - compiled_before
    return time.perf_counter() - start - compiling, compiling


def compile_note(rec: dict) -> str:
    """", + 12.3 s compiling" for a round's line where the step compiled, else ""."""
    seconds = rec.get("compile_seconds") or 0.0
    return f" (+ {seconds:.1f} s compiling)" if seconds else ""


def check_compile(config: TrainConfig, info: DistInfo = SINGLE) -> None:
    """Refuse ``--compile`` where the run's step cannot be one compiled graph, naming why."""
    if not config.compile:
        return
    blockers = whole_step_blockers(config, info)
    if config.is_mixed:
        blockers.append(f"--dtype {config.dtype}'s mixed-precision step has not been made compilable yet")
    if config.cuda_graph:
        blockers.append("--cuda-graph captures the eager step; use one or the other")
    if blockers:
        raise UsageError(f"{flag('compile')}: cannot compile this run's step: {'; '.join(blockers)}")
