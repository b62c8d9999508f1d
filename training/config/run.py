"""The configuration's run part (RunConfig): the run itself -- its implementations, length, output, resume,
precision and device; --eval-iters' parser and --threads' help."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from layers.checks import is_a

from ..errors import UsageError
from .choices import DTYPES, HALF_DTYPES, IMPL_GROUPS, IMPLS, MAX_DIST_TIMEOUT, SEEDS
from .setting import check_part, setting


def parse_eval_iters(text: str) -> int | str:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"invalid value {text!r}: an integer or all") from None


def _threads_help() -> str:
    return (
        f"CPU threads for torch's operations (default: the cores the load average leaves free, at most one per "
        f"core ({torch.get_num_threads()} here), or $OMP_NUM_THREADS, which torchrun sets to 1; the start-up "
        f"line says what was chosen and why); give it for a float32 run that repeats bit for bit"
    )


@dataclass(frozen=True)
class RunConfig:
    """The run itself: which implementations, how long, its seed, device and precision, the compiled or captured
    step, what it records and where, and resuming."""

    impl: str = setting(
        "both",
        "manual: hand-written model; engine: the autodiff engine's Net (MLP only); torch: the "
        "nn.Module twin; both: manual and torch; all: all three",
        choices=(*IMPLS, *IMPL_GROUPS),
        keeps="math",
    )
    epochs: int = setting(10, "image runs: passes over the training split", type=int, low=1, applies=("image",))
    seed: int = setting(
        0, "initial weights, validation split, batch order, dropout and augmentation", type=int, keeps="math"
    )
    device: str = setting("auto", "cpu, cuda, cuda:N or auto", local=True)
    threads: int | None = setting(None, _threads_help, type=int, low=1, metavar="N")
    dtype: str = setting(
        "float32",
        "bfloat16, float16: mixed precision (float32 data and master weights the "
        "optimizer updates, matrix products in the half dtype, softmax/cross-entropy and batch norm "
        "statistics in float32; float16 with a dynamic loss scale; the twin under torch.autocast; "
        "not --impl engine)",
        choices=DTYPES,
        keeps="math",
    )
    log_interval: int = setting(
        50,
        "steps between logged metrics and --monitor records (each epoch's last step and, "
        "with --monitor, the run's first are recorded too)",
        type=int,
        low=1,
        keeps="record",
    )
    val_interval: int = setting(1, "epochs between validations", type=int, low=1, keeps="record", applies=("image",))
    max_iters: int = setting(2000, "training iterations", type=int, low=1, group="text", applies=("text",))
    eval_interval: int = setting(
        250,
        "iterations between evaluations of the train and val loss (and checkpoints)",
        type=int,
        low=1,
        group="text",
        keeps="math",
        applies=("text",),
    )
    eval_iters: int | str = setting(
        20,
        "batches per split and evaluation, or all: every non-overlapping window of the split",
        type=(int, str),
        parse=parse_eval_iters,
        group="text",
        keeps="math",
        applies=("text",),
    )
    cuda_graph: bool | None = setting(
        None,
        "capture the hand-written step once as a CUDA graph and replay it "
        "(default: on with a CUDA device for the MLP without --monitor or torchrun; on "
        "the CPU the same capturable, in-place step runs eagerly)",
        type=bool,
        form="either",
    )
    compile: str | None = setting(
        None,
        "compile the hand-written step with torch.compile as one graph (fullgraph), "
        "and the twin's model as PyTorch users do (torch.compile(model)); the compile time "
        "is reported apart from the time per epoch or iteration. --compile fast: the "
        "hand-written step's guards are not evaluated at calls whose entry state they "
        "already passed (training/compiled_fast.py)",
        choices=("graph", "fast"),
        form="optional",
        const="graph",
        metavar="fast",
    )
    monitor: bool = setting(
        False,
        "record gradient, weight, update and activation statistics of every "
        "implementation every --log-interval steps, at the run's first step and at each epoch's "
        "last (monitor_<impl>.jsonl and monitor_*.png in the output folder)",
        type=bool,
        form="switch",
        keeps="record",
    )
    tensorboard: Path | None = setting(
        None,
        "also write the losses (and with --monitor the statistics and histograms) as TensorBoard event files into DIR",
        type=Path,
        metavar="DIR",
        local=True,
    )
    plots: bool = setting(True, "skip rendering the PNG figures", type=bool, form="negated", local=True)
    dist_timeout: float = setting(
        120.0, "under torchrun: seconds a collective may wait before the run fails", type=float
    )
    out: Path | None = setting(
        None, "output folder (default: runs/<timestamp>-<pid>, unique to the run)", type=Path, local=True
    )
    overwrite: bool = setting(
        False,
        "replace the run already in --out (without it a fresh run there is refused: --resume continues it)",
        type=bool,
        form="switch",
        local=True,
    )
    resume: Path | None = setting(None, "checkpoint.pt to continue from", type=Path, metavar="PATH", local=True)
    dry_run: bool = setting(
        False, "one batch of each, for a smoke test; no checkpoint is written", type=bool, form="switch"
    )
    quiet: bool = setting(False, "print nothing but errors", type=bool, form="switch", local=True)

    def __post_init__(self):
        if self.compile is True:  # a library caller's compile=True: the one-graph step
            object.__setattr__(self, "compile", "graph")
        elif self.compile is False:
            object.__setattr__(self, "compile", None)
        check_part(self)
        if not (self.eval_iters == "all" or (is_a(self.eval_iters, int) and self.eval_iters >= 1)):
            raise UsageError(f"--eval-iters {self.eval_iters!r} is out of range (an integer >= 1, or all)")
        if not is_a(self.seed, int) or not SEEDS[0] <= self.seed <= SEEDS[1]:
            raise UsageError(f"--seed {self.seed} is out of range (an integer from -2**63 to 2**64 - 1)")
        if not (is_a(self.dist_timeout, (int, float)) and 0 < self.dist_timeout <= MAX_DIST_TIMEOUT):
            raise UsageError(
                f"--dist-timeout {self.dist_timeout} is out of range (need seconds > 0 and at most "
                f"{MAX_DIST_TIMEOUT:g})"
            )
        if self.is_mixed and "engine" in self.impls:
            raise UsageError(
                f"--impl {self.impl}: the autodiff engine has no mixed precision (--dtype {self.dtype}); "
                f"use --impl manual, torch or both, or --dtype float32"
            )

    @property
    def impls(self) -> tuple[str, ...]:
        return IMPL_GROUPS.get(self.impl, (self.impl,))

    @property
    def compile_fast(self) -> bool:
        """--compile fast: the compiled step's guards skipped where proven safe (training/compiled_fast.py)."""
        return self.compile == "fast"

    @property
    def is_mixed(self) -> bool:
        """--dtype bfloat16/float16: mixed precision (float32 data and master weights, half matrix products)."""
        return self.dtype in HALF_DTYPES

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype of the data and of the weights the optimizer updates: float32 in a mixed-precision run."""
        return torch.float32 if self.is_mixed else getattr(torch, self.dtype)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the models' matrix products run in: --dtype itself (the half dtype of a mixed run)."""
        return getattr(torch, self.dtype)
