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
from typing import Callable

import torch
from torch import Tensor

from .config import TrainConfig
from .data import Data
from .distributed import SINGLE, DistInfo, all_reduce_sum_, shard
from .errors import NonFiniteLoss
from .impls import Impl


def _set_training(model, mode: bool) -> bool:
    """Put ``model`` in training or eval mode if it has modes; return its previous mode."""
    was = getattr(model, "training", True)
    if hasattr(model, "train"):
        model.train(mode)
    return was


def evaluate(impl: Impl, x: Tensor, y: Tensor, batch: int = 2000, info: DistInfo = SINGLE) -> tuple[float, float]:
    """Mean loss and accuracy over (x, y), in eval mode (running statistics, no dropout); sharded over ranks."""
    n = x.shape[0]
    if info.enabled:  # this rank's contiguous part, as shard() cuts a batch
        lo, hi = info.rank * n // info.world_size, (info.rank + 1) * n // info.world_size
        x, y = x[lo:hi], y[lo:hi]
    was = _set_training(impl.model, False)
    sums = torch.zeros(2, dtype=torch.float64, device=x.device)  # summed loss, correct predictions
    try:
        for i in range(0, x.shape[0], batch):
            loss, logits = impl.eval_batch(x[i:i + batch], y[i:i + batch])
            sums[0] += loss.double()
            sums[1] += (logits.argmax(1) == y[i:i + batch]).sum()
    finally:
        _set_training(impl.model, was)
    if info.enabled:
        all_reduce_sum_(sums)
    loss_sum, correct = sums.tolist()
    return loss_sum / n, correct / n


def train_epoch(impl: Impl, data: Data, perm: Tensor, epoch: int, config: TrainConfig,
                log: Callable[[dict], None], on_log: Callable[[Impl, dict], None] | None = None,
                info: DistInfo = SINGLE) -> dict:
    """One pass over the training split in the order ``perm``; returns the epoch's metrics.

    ``on_log(impl, record)`` may add to each logged step record (gradient statistics, say) before it is logged.
    """
    from tqdm import tqdm
    bs, n = config.batch_size, perm.shape[0]
    steps = 1 if config.dry_run else math.ceil(n / bs)
    window = torch.zeros(config.log_interval, 2, dtype=torch.float64, device=perm.device)  # per step: loss, correct
    sizes: list[int] = []  # global batch sizes of the steps now in the window
    loss_sum, correct, seen = 0.0, 0, 0
    bar = tqdm(total=steps, desc=f"epoch {epoch} {impl.name}", leave=False, file=sys.stdout,
               disable=config.quiet or not info.is_main or not sys.stdout.isatty())
    _set_training(impl.model, True)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        idx = perm[(step - 1) * bs: step * bs]
        total = idx.shape[0]
        if info.enabled:
            idx = shard(idx, info)  # this rank's contiguous slice of the global batch
        x, y = data.train_x[idx], data.train_y[idx]  # a gather on the device, no copies to it
        batch_loss, logits, _ = impl.train_step(x, y, total)
        row = window[len(sizes)]
        row[0].copy_(batch_loss.detach())
        row[1].copy_((logits.argmax(1) == y).sum())
        sizes.append(total)
        if len(sizes) == config.log_interval or step == steps:
            if info.enabled:
                all_reduce_sum_(window[:len(sizes)])  # every rank's sums: the global batches'
            values = window[:len(sizes)].tolist()  # the one read-back in log_interval steps
            first = step - len(sizes) + 1
            for i, (step_loss, step_correct) in enumerate(values):
                if not math.isfinite(step_loss):
                    raise NonFiniteLoss(f"{impl.name}: the training loss became {step_loss} at epoch {epoch}, step "
                                        f"{first + i}; stopping (lower --lr or set --clip-grad); the last good "
                                        f"checkpoint is kept")
                loss_sum += step_loss
                correct += int(step_correct)
            seen += sum(sizes)
            last = sizes[-1]
            sizes.clear()
            rec = {"type": "step", "impl": impl.name, "epoch": epoch, "step": step,
                   "global_step": (epoch - 1) * steps + step, "loss": values[-1][0] / last,
                   "train_loss": loss_sum / seen, "train_acc": correct / seen}
            if on_log is not None:
                on_log(impl, rec)
            log(rec)
            bar.set_postfix(loss=f"{rec['train_loss']:.4f}", acc=f"{rec['train_acc']:.3f}")
        bar.update(1)
    if perm.device.type == "cuda":
        torch.cuda.synchronize(perm.device)
    seconds = time.perf_counter() - start
    bar.close()
    return {"train_loss": loss_sum / seen, "train_acc": correct / seen, "seconds": seconds}
