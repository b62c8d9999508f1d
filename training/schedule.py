"""Learning-rate schedules, stepped once per training step: torch.optim.lr_scheduler on any optimizer here
(handgrad's optimizers are torch.optim.Optimizer subclasses, so torch's schedulers drive them unchanged)."""

from __future__ import annotations

import math

import torch

from .config.optim import OptimConfig


def make_scheduler(
    opt: torch.optim.Optimizer, optim: OptimConfig, total: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """-> an LRScheduler for ``optim.schedule`` over ``total`` steps, or None for a constant rate."""
    if optim.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    if optim.schedule == "warmup-cosine":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda it: warmup_cosine(it, optim) / optim.lr)
    if optim.schedule == "onecycle":
        # Warm up from lr/25 to lr over the first 30% of the steps, anneal to lr/1e4; no momentum cycling, so
        # every optimizer (SGD without momentum, Adagrad) takes it.
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=optim.lr, total_steps=total, cycle_momentum=False)
    return None


def warmup_cosine(it: int, optim: OptimConfig) -> float:
    """nanoGPT's learning rate at iteration ``it`` (counted from 0): a linear warm-up over --warmup-iters, a cosine
    from --lr down to --min-lr at --lr-decay-iters, then --min-lr."""
    lr, min_lr, warmup, decay = optim.lr, optim.min_lr, optim.warmup_iters, optim.lr_decay_iters
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    ratio = (it - warmup) / max(decay - warmup, 1)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)
