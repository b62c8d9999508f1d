"""The model-parallel settings' checks (--tensor-parallel, --pipeline-parallel, --micro-batches, --zero, --schedule,
--sequence-parallel, --check-parity): each on its own, then against the rest of a TrainConfig."""
from __future__ import annotations

from layers.checks import is_a

from .config import PIPELINE_SCHEDULES, flag
from .errors import UsageError


def validate_parallel(self) -> None:
    """The model-parallel settings on their own and against the rest of the config (the world size is checked when
    the run starts: training/parallel/run.py).  Each refusal names the values."""
    for name, low in (("tensor_parallel", 1), ("pipeline_parallel", 1), ("micro_batches", 1)):
        value = getattr(self, name)
        if not is_a(value, int) or value < low:
            raise UsageError(f"{flag(name)} {value!r} is out of range (an integer, at least {low})")
    if not is_a(self.zero, int) or self.zero not in (0, 1, 2):
        raise UsageError(f"--zero {self.zero!r}: the ZeRO stage is 0 (all-reduce), 1 (optimizer state sharded) or 2 "
                         f"(gradients too)")
    if self.pipeline_schedule not in PIPELINE_SCHEDULES:
        raise UsageError(f"--schedule {self.pipeline_schedule!r}: unknown pipeline schedule; known: "
                         f"{', '.join(PIPELINE_SCHEDULES)}")
    if not self.model_parallel:
        return
    T, P = self.tensor_parallel, self.pipeline_parallel
    if self.model != "gpt":
        raise UsageError(f"model parallelism (--tensor-parallel, --pipeline-parallel, --zero, --check-parity) splits "
                         f"the GPT only, not --model {self.model}")
    if self.sequence_parallel and T == 1:
        raise UsageError("--sequence-parallel splits the sequence over the tensor-parallel ranks: give "
                         "--tensor-parallel T > 1")
    if P == 1 and ("micro_batches" in self.given or "pipeline_schedule" in self.given):
        what = "--micro-batches" if "micro_batches" in self.given else "--schedule " + self.pipeline_schedule
        raise UsageError(f"{what} applies to a pipeline: give --pipeline-parallel P > 1")
    # (n_embd is a multiple of n_head already)
    for what, n, parts in (("--n-head", self.n_head, T), ("--n-layer", self.n_layer, P)):
        if n % parts:
            split = "--tensor-parallel" if parts == T else "--pipeline-parallel"
            raise UsageError(f"{what} {n} does not divide by {split} {parts}")
    if self.sequence_parallel and self.block_size % T:
        raise UsageError(f"--block-size {self.block_size} does not divide by --tensor-parallel {T} (sequence "
                         f"parallelism gives each rank block_size / T positions)")
    if self.dropout:
        raise UsageError(f"--dropout {self.dropout}: model parallelism runs without dropout (its masks would have to "
                         f"be drawn for the whole model on every rank); use --dropout 0")
    if self.impl != "manual":
        raise UsageError(f"--impl {self.impl}: model parallelism trains the hand-written GPT (--impl manual); its "
                         f"twins are training/parallel/*_twin.py, tested against it")
    for name, bad in (("dtype", self.is_mixed), ("compile", self.compile), ("cuda_graph", bool(self.cuda_graph)),
                      ("monitor", self.monitor)):
        if bad:
            value = "" if isinstance(getattr(self, name), bool) else f" {getattr(self, name)}"
            raise UsageError(f"{flag(name)}{value} with model parallelism is not supported (float32 or float64, "
                             f"eager, no monitor)")
    if self.check_parity and self.resume is not None:
        raise UsageError(f"--check-parity with --resume {self.resume}: the check takes a fresh run's first step; "
                         f"drop --resume")
