"""The training loop: one epoch over a permutation, and evaluation.

Nothing is read back from the device per step: each step's loss and number of correct predictions go into a
small device buffer, read back in one transfer every ``log_interval`` steps; a non-finite loss found there
still names the exact epoch and step where it first appeared.

Under torchrun every rank walks the same permutation and trains on its own slice of each global batch
(``shard``); the read-back buffer and the evaluation sums are all-reduced, so every rank reports the global
numbers and rank 0 logs them.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from .compiled import compile_seconds, round_seconds
from .config.data import DataConfig
from .config.run import RunConfig
from .errors import NonFiniteLoss
from .impls import Impl
from .impls.models import use_generator
from .parallel.distributed import SINGLE, DistInfo, all_reduce_sum_, shard_bounds
from .tasks.augment import flip_and_shift
from .tasks.image_data import Data


def set_training(model, mode: bool) -> bool:
    """Put ``model`` in training or eval mode if it has modes; return its previous mode."""
    was = getattr(model, "training", True)
    if hasattr(model, "train"):
        model.train(mode)
    return was


def evaluate(impl: Impl, x: Tensor, y: Tensor, batch: int = 2000, info: DistInfo = SINGLE) -> tuple[float, float]:
    """Mean loss and accuracy over (x, y), in eval mode (running statistics, no dropout); sharded over ranks."""
    n = x.shape[0]
    if info.enabled:  # this rank's contiguous part
        lo, hi = shard_bounds(n, info)
        x, y = x[lo:hi], y[lo:hi]
    was = set_training(impl.model, False)
    sums = torch.zeros(2, dtype=torch.float64, device=x.device)  # summed loss, correct predictions
    try:
        for i in range(0, x.shape[0], batch):
            loss, logits = impl.eval_batch(x[i : i + batch], y[i : i + batch])
            sums[0] += loss.double()
            sums[1] += (logits.argmax(1) == y[i : i + batch]).sum()
    finally:
        set_training(impl.model, was)
    if info.enabled:
        all_reduce_sum_(sums)
    loss_sum, correct = sums.tolist()
    return loss_sum / n, correct / n


class Where(Protocol):
    """``where(i)``: the place in the run of the i-th row taken ("epoch 2, step 17"), for StepSums.take's error
    (a Protocol, not a Callable: the type checker then takes a lambda that binds loop variables as defaults)."""

    def __call__(self, i: int, /) -> str: ...


class StepSums:
    """Per-step sums (a step's summed loss, and a classifier's correct predictions) kept in a small device buffer
    and read back once every ``every`` steps: the training loop's one host synchronisation.  Under torchrun the
    rows are all-reduced first, so every rank reads the global batches' sums."""

    def __init__(self, every: int, columns: int, device: torch.device, info: DistInfo = SINGLE) -> None:
        self.buf = torch.zeros(every, columns, dtype=torch.float64, device=device)
        self.kept, self.info = 0, info

    def add(self, *values: Tensor) -> None:
        """One step's sums (device scalars), copied into the next row: no read-back."""
        row = self.buf[self.kept]
        for i, v in enumerate(values):
            row[i].copy_(v)
        self.kept += 1

    def due(self, last: bool) -> bool:
        """Whether to read back now: the buffer is full, or the round's last step was added."""
        return self.kept == self.buf.shape[0] or last

    def take(self, name: str, where: Where) -> list[list[float]]:
        """The rows so far, as numbers, emptied; a non-finite loss (column 0) stops the run naming the step where
        it first appeared, ``where(i)`` for row i ("epoch 2, step 17", "iteration 340")."""
        rows = self.buf[: self.kept]
        if self.info.enabled:
            all_reduce_sum_(rows)
        values = rows.tolist()
        self.kept = 0
        for i, row in enumerate(values):
            if not math.isfinite(row[0]):
                raise NonFiniteLoss(
                    f"{name}: the training loss became {row[0]} at {where(i)}; stopping (lower --lr "
                    f"or set --clip-grad); the last good checkpoint is kept"
                )
        return values


def epoch_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    """The random stream of one epoch's augmentation and dropout masks, the same for every implementation (each
    replays it from the start of the epoch) and reproducible on resume (a function of the seed and epoch)."""
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + epoch) % 2**64)  # torch's range


def train_epoch(
    impl: Impl,
    data: Data,
    perm: Tensor,
    epoch: int,
    batches: DataConfig,
    run: RunConfig,
    log: Callable[[dict], None],
    info: DistInfo = SINGLE,
    after_step: Callable[[Impl, int, Tensor], None] | None = None,
) -> dict:
    """One pass over the training split in the order ``perm``, in batches of ``batches.batch_size`` (augmented
    if it says so); returns the epoch's metrics.  Step numbers (``global_step``, the monitor's) count from 1 at the
    run's first step; ``after_step(impl, global_step, logits)`` is called after each (training/drift.py's)."""
    from tqdm import tqdm

    bs, n = batches.batch_size, perm.shape[0]
    steps = 1 if run.dry_run else math.ceil(n / bs)
    sums = StepSums(run.log_interval, 2, perm.device, info)  # per step: summed loss, correct predictions
    sizes: list[int] = []  # global batch sizes of the steps now in the buffer
    loss_sum, correct, seen = 0.0, 0, 0
    bar = tqdm(
        total=steps,
        desc=f"epoch {epoch} {impl.name}",
        leave=False,
        file=sys.stdout,
        disable=run.quiet or not info.is_main or not sys.stdout.isatty(),
    )
    set_training(impl.model, True)
    gen = epoch_generator(run.seed, epoch, perm.device)
    use_generator(impl.model, gen)
    rows = None  # under torchrun: (lo, hi, total), this rank's rows of the global batch the dropouts were given
    start, compiling = time.perf_counter(), compile_seconds(impl)
    for step in range(1, steps + 1):
        idx = perm[(step - 1) * bs : step * bs]
        total = idx.shape[0]
        if batches.augment:  # the whole global batch on every rank, so each rank's slice is the one-process one's
            x = flip_and_shift(data.train_x[idx].view(total, -1, 28, 28), gen, fill=data.background)
            x = x.view(total, *data.train_x.shape[1:])
        else:
            x = data.train_x[idx]  # a gather on the device, no copies to it
        y = data.train_y[idx]
        if info.enabled:  # this rank's contiguous slice of the global batch
            lo, hi = shard_bounds(total, info)
            x, y = x[lo:hi], y[lo:hi]
            if rows != (lo, hi, total):  # the first step, and the epoch's last, smaller batch
                rows = (lo, hi, total)
                use_generator(impl.model, gen, rows)  # dropout keeps its rows of the global batch's mask
        batch_loss, logits, _ = impl.train_step(x, y, total, (epoch - 1) * steps + step)
        if impl.sched is not None:
            impl.sched.step()
        if after_step is not None:
            after_step(impl, (epoch - 1) * steps + step, logits)
        sums.add(batch_loss.detach(), (logits.argmax(1) == y).sum())
        sizes.append(total)
        if sums.due(step == steps):
            first = step - len(sizes) + 1
            values = sums.take(impl.name, lambda i, first=first: f"epoch {epoch}, step {first + i}")
            for step_loss, step_correct in values:
                loss_sum += step_loss
                correct += int(step_correct)
            seen += sum(sizes)
            last = sizes[-1]
            sizes.clear()
            rec = {
                "type": "step",
                "impl": impl.name,
                "epoch": epoch,
                "step": step,
                "global_step": (epoch - 1) * steps + step,
                "loss": values[-1][0] / last,
                "train_loss": loss_sum / seen,
                "train_acc": correct / seen,
            }
            log(rec)
            bar.set_postfix(loss=f"{rec['train_loss']:.4f}", acc=f"{rec['train_acc']:.3f}")
        bar.update(1)
    seconds, compiling = round_seconds(impl, perm.device, start, compiling)  # --compile: compiling apart
    bar.close()
    return {
        "train_loss": loss_sum / seen,
        "train_acc": correct / seen,
        "seconds": seconds,
        "compile_seconds": compiling,
    }
