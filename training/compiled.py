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

An error while the step compiles or runs compiled (handgrad's own checks arrive wrapped in the compiler's exception,
or as a graph assertion that cannot name the value) reaches the caller as the eager step's: ``compile_step`` runs
the step once eagerly on the same state and raises what that raises -- the very type and message -- then puts the
state back (weights, gradients, buffers, optimizer state, random state).  An error the eager step does not
reproduce is the compiler's, and is raised as it came.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch

from .config.run import RunConfig
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


def compile_step(step: Callable, model, opt, **compile_kwargs) -> Callable:
    """``torch.compile(step, fullgraph=True)`` whose errors are the eager step's (see the module's docstring); ``model``
    and ``opt`` (a handgrad model and its optimizer) hold the state the step changes."""
    compiled = torch.compile(step, fullgraph=True, **compile_kwargs)

    def run(*args):
        try:
            return compiled(*args)
        except Exception as e:
            failed = e
        # outside the except block, so that the eager error comes alone, not "during handling of" the compiler's
        eager = _eager_error(step, args, model, opt)
        raise failed if eager is None else eager

    return run


def _eager_error(step: Callable, args: tuple, model, opt) -> Exception | None:
    """What ``step(*args)`` raises when run eagerly (None if nothing), leaving the state as it found it."""
    state = [
        *model.parameters(),
        *(b for _, b in model.named_buffers()),
        *(v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)),
    ]
    cuda = sorted(
        {
            torch.cuda.current_device() if t.device.index is None else t.device.index
            for t in state
            if t.device.type == "cuda"
        }
    )
    with torch.random.fork_rng(devices=cuda), _kept(state, _generators(model)):
        try:
            step(*args)
        except Exception as e:
            return e
    return None


def _generators(model) -> list[torch.Generator]:
    """The model's layers' own generators (a dropout layer's ``generator``), which fork_rng does not cover."""
    found, stack = [], [model]
    while stack:
        layer = stack.pop()
        if isinstance(g := getattr(layer, "generator", None), torch.Generator):
            found.append(g)
        children = getattr(layer, "named_children", None)
        stack.extend(child for _, child in (children() if children is not None else ()))
    return found


class _kept:
    """Put back, on leaving, each tensor's values and its ``.grad`` (the object, and its values), and each
    generator's state."""

    def __init__(self, tensors: Iterable[torch.Tensor], generators: Iterable[torch.Generator] = ()):
        self.saved = [
            (t, t.detach().clone(), t.grad, None if t.grad is None else t.grad.detach().clone())
            for t in {id(t): t for t in tensors}.values()
        ]
        self.generators = [(g, g.get_state()) for g in generators]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        with torch.no_grad():
            for t, value, grad, grad_value in self.saved:
                t.copy_(value)
                t.grad = grad
                if grad is not None:
                    grad.copy_(grad_value)
        for g, state in self.generators:
            g.set_state(state)
        return False


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
    """ ", + 12.3 s compiling" for a round's line where the step compiled, else ""."""
    seconds = rec.get("compile_seconds") or 0.0
    return f" (+ {seconds:.1f} s compiling)" if seconds else ""


def check_compile(run: RunConfig, info: DistInfo = SINGLE) -> None:
    """Refuse ``--compile`` where the run's step cannot be one compiled graph, naming why."""
    if not run.compile:
        return
    blockers = whole_step_blockers(run, info)
    if run.is_mixed:
        blockers.append(f"--dtype {run.dtype}'s mixed-precision step has not been made compilable yet")
    if run.cuda_graph:
        blockers.append("--cuda-graph captures the eager step; use one or the other")
    if blockers:
        raise UsageError(f"--compile: cannot compile this run's step: {'; '.join(blockers)}")
