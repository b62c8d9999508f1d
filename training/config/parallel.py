"""The configuration's model-parallel part (ParallelConfig): how the GPT is split over the ranks under
torchrun, and the split checked against the model and the run (check_split)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from layers.checks import is_a

from ..errors import UsageError
from .choices import PIPELINE_SCHEDULES, flag
from .model import ModelConfig
from .run import RunConfig
from .setting import check_part, setting


@dataclass(frozen=True)
class ParallelConfig:
    """How the GPT is split over the ranks under torchrun (training/parallel/run.py): T x P ranks hold one copy
    of the model, data parallelism over the rest of the world size."""

    tensor_parallel: int = setting(
        1,
        "split each block's heads and MLP width, and the vocabulary, over T ranks (Megatron's f and g by hand)",
        type=int,
        low=1,
        metavar="T",
        group="parallel",
    )
    sequence_parallel: bool = setting(
        False,
        "with --tensor-parallel: layer norms and residuals on each rank's "
        "block_size / T positions (all-gather / reduce-scatter along the sequence)",
        type=bool,
        form="switch",
        group="parallel",
    )
    context_parallel: int = setting(
        1,
        "split each window's positions over C ranks, two zigzag chunks a rank (one early, one late), the "
        "attention a ring passing keys and values round (ring attention by hand)",
        type=int,
        low=1,
        metavar="C",
        group="parallel",
    )
    expert_parallel: int = setting(
        1,
        "with --n-experts: split each block's experts over E ranks, each rank's tokens sent to their experts' "
        "ranks and back (all-to-all by hand); the world size is E, data parallelism over the same ranks",
        type=int,
        low=1,
        metavar="E",
        group="parallel",
    )
    pipeline_parallel: int = setting(
        1,
        "cut the blocks into P stages (P x V with several stages a rank), run by --schedule gpipe, 1f1b, zb-h1, "
        "interleaved-1f1b or zb-v",
        type=int,
        low=1,
        metavar="P",
        group="parallel",
    )
    pipeline_schedule: str = setting(
        "1f1b",
        "the same as --schedule gpipe|1f1b|zb-h1|interleaved-1f1b|zb-v",
        choices=PIPELINE_SCHEDULES,
        shares="schedule",
        group="parallel",
    )
    virtual_stages: int = setting(
        1,
        "--schedule interleaved-1f1b: the stages each rank holds (V >= 2; rank r runs stages r, r + P, ...), "
        "the bubble about V times smaller for V times the messages",
        type=int,
        low=1,
        metavar="V",
        group="parallel",
    )
    micro_batches: int = setting(
        1,
        "a pipelined step's micro-batches (each data-parallel rank's batch splits into M equal parts)",
        type=int,
        low=1,
        metavar="M",
        group="parallel",
    )
    zero: int = setting(
        0,
        "ZeRO over the data-parallel ranks: 0 all-reduce, 1 optimizer state sharded, 2 gradients sharded too",
        type=int,
        choices=(0, 1, 2),
        group="parallel",
    )
    check_parity: bool = setting(
        False,
        "run the first step sharded and in one process (rank 0), print per tensor "
        "the largest difference and whether it is float64 round-off or a bug, and stop",
        type=bool,
        form="switch",
        group="parallel",
    )

    def __post_init__(self):
        for name in (
            "tensor_parallel",
            "context_parallel",
            "expert_parallel",
            "pipeline_parallel",
            "virtual_stages",
            "micro_batches",
        ):
            value = getattr(self, name)
            if not is_a(value, int) or value < 1:
                raise UsageError(f"{flag(name)} {value!r} is out of range (an integer, at least 1)")
        if not is_a(self.zero, int) or self.zero not in (0, 1, 2):
            raise UsageError(
                f"--zero {self.zero!r}: the ZeRO stage is 0 (all-reduce), 1 (optimizer state sharded) "
                f"or 2 (gradients too)"
            )
        if self.pipeline_schedule not in PIPELINE_SCHEDULES:
            raise UsageError(
                f"--schedule {self.pipeline_schedule!r}: unknown pipeline schedule; known: "
                f"{', '.join(PIPELINE_SCHEDULES)}"
            )
        check_part(self)

    @property
    def stages_a_rank(self) -> int:
        """V: the pipeline stages a rank holds (--virtual-stages under interleaved 1F1B, two under ZB-V, else one)."""
        from ..parallel.pipeline_schedules import chunks_per_rank

        return chunks_per_rank(self.pipeline_schedule, self.virtual_stages)

    def split(self) -> dict:
        """The settings that decide each rank's state and the order of every sum: a resume must keep them all."""
        return {k: getattr(self, k) for k in PARALLEL_KEYS if k != "check_parity"}

    def requested(self, given: frozenset) -> bool:
        """Whether the run takes training/parallel/run.py's path: a split asked for, or any of its settings
        given (a checkpoint's split of all defaults too)."""
        return (
            self.tensor_parallel > 1
            or self.context_parallel > 1
            or self.expert_parallel > 1
            or self.pipeline_parallel > 1
            or self.zero > 0
            or self.check_parity
            or self.sequence_parallel
            or any(n in given for n in PARALLEL_KEYS)
        )

    def check_split(self, model: ModelConfig, run: RunConfig, given: frozenset) -> None:
        """The split against the model it splits and the run (the world size is checked when the run starts:
        training/parallel/run.py).  Each refusal names the values."""
        T, P = self.tensor_parallel, self.pipeline_parallel
        if model.name != "gpt":
            raise UsageError(
                f"model parallelism (--tensor-parallel, --context-parallel, --pipeline-parallel, --zero, "
                f"--check-parity) splits the GPT only, not --model {model.name}"
            )
        if self.sequence_parallel and T == 1:
            raise UsageError(
                "--sequence-parallel splits the sequence over the tensor-parallel ranks: give --tensor-parallel T > 1"
            )
        given_pipe = [k for k in ("micro_batches", "pipeline_schedule", "virtual_stages") if k in given]
        if P == 1 and given_pipe:
            what = (
                "--schedule " + self.pipeline_schedule if given_pipe[0] == "pipeline_schedule" else flag(given_pipe[0])
            )
            raise UsageError(f"{what} applies to a pipeline: give --pipeline-parallel P > 1")
        if P > 1:  # the counts the schedule needs (pipeline_schedules.check_schedule names them)
            from ..parallel.pipeline_schedules import check_schedule

            try:
                check_schedule(self.pipeline_schedule, P, self.micro_batches, self.virtual_stages)
            except ValueError as e:
                raise UsageError(str(e)) from None
        # (n_embd is a multiple of n_head already)
        n_layer = cast(int, model.n_layer)  # the GPT's per-model default, filled in by TrainConfig
        for what, n, parts in (("--n-head", model.n_head, T), ("--n-layer", n_layer, P)):
            if n % parts:
                split = "--tensor-parallel" if parts == T else "--pipeline-parallel"
                raise UsageError(f"{what} {n} does not divide by {split} {parts}")
        V = self.stages_a_rank
        if n_layer % (P * V):
            raise UsageError(
                f"--n-layer {n_layer} does not divide by --pipeline-parallel {P} x {V} stages a rank "
                f"(--schedule {self.pipeline_schedule}) = {P * V} stages"
            )
        if self.sequence_parallel and model.block_size % T:
            raise UsageError(
                f"--block-size {model.block_size} does not divide by --tensor-parallel {T} (sequence "
                f"parallelism gives each rank block_size / T positions)"
            )
        C = self.context_parallel
        if C > 1 and P > 1:
            raise UsageError(
                f"--context-parallel {C} with --pipeline-parallel {P} is not supported: context parallelism "
                f"composes with tensor and data parallelism"
            )
        if C > 1 and model.block_size % (2 * C):
            raise UsageError(
                f"--block-size {model.block_size} does not divide by 2 x --context-parallel {C} (each rank holds "
                f"two chunks of every window)"
            )
        if C > 1 and self.sequence_parallel and (model.block_size // C) % T:
            raise UsageError(
                f"--block-size {model.block_size} / --context-parallel {C} = {model.block_size // C} positions a "
                f"rank do not divide by --tensor-parallel {T} (--sequence-parallel splits them further)"
            )
        E = self.expert_parallel
        if E > 1 and not model.n_experts:
            raise UsageError(
                f"--expert-parallel {E} splits a mixture of experts: give --n-experts K (a multiple of {E})"
            )
        if E > 1 and model.n_experts % E:
            raise UsageError(f"--n-experts {model.n_experts} does not divide by --expert-parallel {E}")
        if model.n_experts and (T > 1 or C > 1 or P > 1 or self.zero):
            raise UsageError(
                f"--n-experts {model.n_experts} with --tensor-parallel {T} --context-parallel {C} "
                f"--pipeline-parallel {P} --zero {self.zero} is not supported: a mixture of experts splits with "
                f"--expert-parallel E alone (data parallelism over the same ranks)"
            )
        if model.dropout:
            raise UsageError(
                f"--dropout {model.dropout}: model parallelism runs without dropout (its masks would "
                f"have to be drawn for the whole model on every rank); use --dropout 0"
            )
        if run.impl != "manual":
            raise UsageError(
                f"--impl {run.impl}: model parallelism trains the hand-written GPT (--impl manual); its "
                f"twins are training/parallel/verify/*_twin.py, tested against it"
            )
        for name, bad in (
            ("dtype", run.is_mixed),
            ("compile", bool(run.compile)),
            ("cuda_graph", bool(run.cuda_graph)),
            ("monitor", run.monitor),
        ):
            if bad:
                value = f" {run.dtype}" if name == "dtype" else ""
                raise UsageError(
                    f"{flag(name)}{value} with model parallelism is not supported (float32 or "
                    f"float64, eager, no monitor)"
                )
        if self.check_parity and run.resume is not None:
            raise UsageError(
                f"--check-parity with --resume {run.resume}: the check takes a fresh run's first step; drop --resume"
            )


PARALLEL_KEYS = tuple(f for f in ParallelConfig.__dataclass_fields__)
