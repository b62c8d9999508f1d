"""CapturedStep: a training step recorded once as a CUDA graph and replayed, a plain call everywhere else;
use_cuda_graph: whether train.py captures its hand-written step (``--cuda-graph``).

A hand-written step launches the same kernels in the same order every time; at small sizes a GPU
spends most of such a step waiting for the CPU to launch them.  ``torch.cuda.graph`` records the
launches once and ``replay()`` re-issues them all in one call.  What a graph needs of the step, and
what handgrad's layers, losses and ``capturable=True`` optimizers provide (tests/test_step_in_place.py):
no read-back to the host, no CPU tensor, and inputs in fixed ("static") buffers, copied in before
each replay.

    step = CapturedStep(step_fn, x0, y0)       # step_fn(x, y) -> loss (any tensors, or None)
    for x, y in batches:
        loss = step(x, y)                      # eager for `warmup` calls, then captured, then replayed

Every call is exactly one real step (warm-up calls run eagerly on a side stream, as capture needs;
the capturing call replays what it recorded at once), so a captured run takes the same steps as an
eager one.  A batch whose shape, dtype or device differs from the example's (an epoch's last, smaller
batch) runs eagerly, correctly.  On the CPU, or with ``enabled=False``, ``step(x, y)`` is
``step_fn(x, y)``: the same training code runs everywhere.

What a replay does not redo (each is frozen at capture):
- Python values: hyper-parameters read as numbers (a float learning rate changed by a scheduler after
  capture is ignored: give the optimizer a tensor lr on the device, which its capturable kernels read and
  the scheduler fills in place -- train.py does -- or call ``recapture()`` after changing one), Python
  branches, the set of parameters that have a gradient.
- The value checks that need a read-back: cross-entropy's class-range check is skipped while capturing
  (losses/cross_entropy.py), so a replay does not check targets.
- The outputs: replays write the same output tensors; use (or copy) them before the next call.
- Random numbers from a ``torch.Generator`` of your own (dropout with ``generator=``): pass it in
  ``generators`` so that each replay draws fresh numbers (the default CUDA generator is handled by torch).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from torch import Tensor

from layers.checks import check_int

from .config.choices import TEXT_MODELS
from .config.run import RunConfig
from .errors import UsageError
from .parallel.distributed import SINGLE, DistInfo


class CapturedStep:
    """``CapturedStep(step_fn, example_x, example_y, *, warmup=3, enabled=None, generators=())``.

    step_fn(x, y): one whole training step (zero_grad, forward, loss, backward, optimizer step) on the
        tensors it is given, returning tensors (or None); it must be capturable -- handgrad's layers and
        losses are, its optimizers with ``capturable=True`` are.
    example_x, example_y: tensors with the shapes, dtypes and device of the batches to capture (their
        values are not used; nothing is run at construction).
    warmup: eager calls (on a side stream) before capture; at least 1, so that lazily created state
        (optimizer moments, momentum buffers, ``.grad`` tensors) exists before capture.
    enabled: None = capture on CUDA, call step_fn directly elsewhere; False = always call directly;
        True = capture (an error unless the examples are CUDA tensors).
    generators: torch.Generator objects on the CUDA device that step_fn draws from (besides the default).
    fallback: if capturing raises, warn and run every later call eagerly instead of raising (the step that
        was being captured then runs eagerly: no step is lost or doubled).

    Counters: ``eager_calls``, ``replays``, ``captures``.
    """

    def __init__(
        self,
        step_fn: Callable[[Tensor, Tensor], Any],
        example_x: Tensor,
        example_y: Tensor,
        *,
        warmup: int = 3,
        enabled: bool | None = None,
        generators: Iterable[torch.Generator] = (),
        fallback: bool = False,
    ):
        if not callable(step_fn):
            raise TypeError(f"CapturedStep: step_fn must be callable, got {type(step_fn).__name__}")
        for name, t in (("example_x", example_x), ("example_y", example_y)):
            if not isinstance(t, Tensor):
                raise TypeError(f"CapturedStep: {name} must be a tensor, got {type(t).__name__}")
        check_int("CapturedStep", "warmup", warmup, why=" (capture needs the step's state to exist)")
        on_cuda = example_x.device.type == "cuda" and example_y.device == example_x.device
        if enabled and not on_cuda:
            raise ValueError(
                f"CapturedStep: enabled=True needs example_x and example_y on one CUDA device, got "
                f"{example_x.device} and {example_y.device}"
            )
        self.step_fn = step_fn
        self.enabled = on_cuda if enabled is None else bool(enabled)
        self.warmup = warmup
        self.generators = list(generators)
        self.fallback = bool(fallback)
        self._signature = _signature(example_x, example_y)
        self._static_x: Tensor | None = None
        self._static_y: Tensor | None = None
        if self.enabled:
            self._static_x = torch.empty_like(example_x, memory_format=torch.contiguous_format)
            self._static_y = torch.empty_like(example_y, memory_format=torch.contiguous_format)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._static_out: Any = None
        self._warm = 0
        self.eager_calls = self.replays = self.captures = 0

    def __repr__(self) -> str:
        state = "disabled" if not self.enabled else "captured" if self._graph is not None else "not captured yet"
        return (
            f"CapturedStep({getattr(self.step_fn, '__name__', self.step_fn)!r}, {state}, "
            f"eager_calls={self.eager_calls}, replays={self.replays})"
        )

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def recapture(self) -> None:
        """Forget the graph: the next full-size call captures again (after a hyper-parameter changed)."""
        self._graph = None
        self._static_out = None

    def __call__(self, x: Tensor, y: Tensor) -> Any:
        if not self.enabled or _signature(x, y) != self._signature:
            self.eager_calls += 1
            return self.step_fn(x, y)  # on the current stream: correct for any shape
        static_x, static_y = self._statics()
        static_x.copy_(x)
        static_y.copy_(y)
        if self._graph is None and self._warm < self.warmup:
            self._warm += 1
            self.eager_calls += 1
            return self._on_side_stream()
        if self._graph is None:
            try:
                self._capture()
            except Exception as e:  # torch.cuda.graph has ended (invalidated) the capture on the way out
                if not self.fallback:
                    raise
                first = (str(e).strip().splitlines() or [""])[0][:200]
                warnings.warn(
                    f"CapturedStep: capturing the step failed ({type(e).__name__}: {first}); running it "
                    f"eagerly from now on",
                    RuntimeWarning,
                    stacklevel=2,
                )
                self.enabled = False
                torch.cuda.synchronize(static_x.device)
                self.eager_calls += 1
                return self.step_fn(x, y)
        cast(torch.cuda.CUDAGraph, self._graph).replay()  # captured above
        self.replays += 1
        return self._static_out

    def _statics(self) -> tuple[Tensor, Tensor]:
        """The captured step's input buffers: made in __init__ when it was enabled (the only callers' case)."""
        return cast(Tensor, self._static_x), cast(Tensor, self._static_y)

    def _on_side_stream(self) -> Any:
        """An eager step on a side stream (capture requires warm-up there), the caller's stream waiting."""
        static_x, static_y = self._statics()
        side, main = torch.cuda.Stream(device=static_x.device), torch.cuda.current_stream(static_x.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            out = self.step_fn(static_x, static_y)
        main.wait_stream(side)
        return out

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        for gen in self.generators:
            graph.register_generator_state(gen)
        static_x, static_y = self._statics()
        torch.cuda.synchronize(static_x.device)
        with torch.cuda.graph(graph):  # records the launches; nothing runs until replay()
            self._static_out = self.step_fn(static_x, static_y)
        self._graph = graph
        self.captures += 1


def _signature(x: Tensor, y: Tensor) -> tuple:
    return tuple((t.shape, t.dtype, t.device) for t in (x, y))


def whole_step_blockers(run: RunConfig, info: DistInfo) -> list[str]:
    """Why this run's step cannot be taken as one unit -- captured as a CUDA graph, or compiled as one graph
    (training/compiled.py) -- whichever way: the reasons the two share."""
    blockers = []
    if info.enabled:
        blockers.append("under torchrun the gradient all-reduces run between the layers' backwards")
    if run.monitor:
        blockers.append("--monitor reads statistics back during the step")
    return blockers


def use_cuda_graph(run: RunConfig, model: str, device: torch.device, info: DistInfo = SINGLE) -> bool:
    """Whether the hand-written step of ``model`` is captured as a CUDA graph (``--cuda-graph``; on by default on
    CUDA where the run allows it).  On the CPU ``--cuda-graph`` runs the same capturable, in-place step eagerly."""
    blockers = whole_step_blockers(run, info)
    if run.is_mixed:
        blockers.append(
            f"--dtype {run.dtype}'s mixed-precision step is not capturable yet (the float16 loss "
            f"scaler reads its overflow flag back)"
        )
    if model == "cnn":
        blockers.append(
            "--model cnn's dropout draws from a generator seeded afresh every epoch, which a graph would freeze"
        )
    if model in TEXT_MODELS:
        blockers.append(
            f"--model {model}'s step (attention or recurrence, a language model's loss) has not "
            f"been made capturable yet; it runs eagerly"
        )
    if run.cuda_graph is None:
        return device.type == "cuda" and not blockers and not run.compile  # --compile: the compiled step
    if run.cuda_graph and blockers:
        raise UsageError(f"--cuda-graph: cannot capture this run's step: {'; '.join(blockers)}")
    return bool(run.cuda_graph)
