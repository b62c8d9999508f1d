"""Learning-rate schedules, stepped once per training step: torch.optim.lr_scheduler on any optimizer here
(handgrad's optimizers are torch.optim.Optimizer subclasses, so torch's schedulers drive them unchanged)."""
from __future__ import annotations

import math

import torch

from .config import TrainConfig


def make_scheduler(opt: torch.optim.Optimizer, config: TrainConfig, steps_per_epoch: int):
    """-> an LRScheduler for ``config.schedule``, or None for a constant rate."""
    total = steps_per_epoch * config.epochs
    if config.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    if config.schedule == "warmup-cosine":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda it: warmup_cosine(it, config) / config.lr)
    if config.schedule == "onecycle":
        # Warm up from lr/25 to lr over the first 30% of the steps, anneal to lr/1e4; no momentum cycling, so
        # every optimizer (SGD without momentum, Adagrad) takes it.
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=total, cycle_momentum=False)
    return None


def warmup_cosine(it: int, config: TrainConfig) -> float:
    """nanoGPT's learning rate at iteration ``it`` (counted from 0): a linear warm-up over --warmup-iters, a cosine
    from --lr down to --min-lr at --lr-decay-iters, then --min-lr."""
    lr, min_lr, warmup, decay = config.lr, config.min_lr, config.warmup_iters, config.lr_decay_iters
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    ratio = (it - warmup) / max(decay - warmup, 1)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)
