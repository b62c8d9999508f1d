"""The training loop: one epoch over a permutation, and evaluation.

Nothing is read back from the device per step: each step's loss and number of correct predictions go into a
small device buffer, read back in one transfer every ``log_interval`` steps; a non-finite loss found there
still names the exact epoch and step where it first appeared.
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
from .errors import NonFiniteLoss
from .impls import Impl


def _set_training(model, mode: bool) -> bool:
    """Put ``model`` in training or eval mode if it has modes; return its previous mode."""
    was = getattr(model, "training", True)
    if hasattr(model, "train"):
        model.train(mode)
    return was


def evaluate(impl: Impl, x: Tensor, y: Tensor, batch: int = 2000) -> tuple[float, float]:
    """Mean loss and accuracy over (x, y), in eval mode (running statistics, no dropout)."""
    was = _set_training(impl.model, False)
    loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    try:
        for i in range(0, x.shape[0], batch):
            loss, logits = impl.eval_batch(x[i:i + batch], y[i:i + batch])
            loss_sum += loss.double()
            correct += (logits.argmax(1) == y[i:i + batch]).sum()
    finally:
        _set_training(impl.model, was)
    n = x.shape[0]
    return loss_sum.item() / n, correct.item() / n


def train_epoch(impl: Impl, data: Data, perm: Tensor, epoch: int, config: TrainConfig,
                log: Callable[[dict], None], on_log: Callable[[Impl, dict], None] | None = None) -> dict:
    """One pass over the training split in the order ``perm``; returns the epoch's metrics.

    ``on_log(impl, record)`` may add to each logged step record (gradient statistics, say) before it is logged.
    """
    from tqdm import tqdm
    bs, n = config.batch_size, perm.shape[0]
    steps = 1 if config.dry_run else math.ceil(n / bs)
    window = torch.zeros(config.log_interval, 2, dtype=torch.float64, device=perm.device)  # per step: loss, correct
    sizes: list[int] = []  # batch sizes of the steps now in the window
    loss_sum, correct, seen = 0.0, 0, 0
    bar = tqdm(total=steps, desc=f"epoch {epoch} {impl.name}", leave=False, file=sys.stdout,
               disable=config.quiet or not sys.stdout.isatty())
    _set_training(impl.model, True)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        idx = perm[(step - 1) * bs: step * bs]
        x, y = data.train_x[idx], data.train_y[idx]  # a gather on the device, no copies to it
        loss, logits, _ = impl.train_step(x, y)
        row = window[len(sizes)]
        row[0].copy_(loss.detach())
        row[1].copy_((logits.argmax(1) == y).sum())
        sizes.append(y.shape[0])
        if len(sizes) == config.log_interval or step == steps:
            values = window[:len(sizes)].tolist()  # the one read-back in log_interval steps
            first = step - len(sizes) + 1
            for i, ((step_loss, step_correct), size) in enumerate(zip(values, sizes)):
                if not math.isfinite(step_loss):
                    raise NonFiniteLoss(f"{impl.name}: the training loss became {step_loss} at epoch {epoch}, step "
                                        f"{first + i}; stopping (lower --lr or set --clip-grad); the last good "
                                        f"checkpoint is kept")
                loss_sum += step_loss * size
                correct += int(step_correct)
            seen += sum(sizes)
            sizes.clear()
            rec = {"type": "step", "impl": impl.name, "epoch": epoch, "step": step,
                   "global_step": (epoch - 1) * steps + step, "loss": values[-1][0],
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
