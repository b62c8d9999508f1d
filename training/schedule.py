"""Learning-rate schedules, stepped once per training step: torch.optim.lr_scheduler on any optimizer here
(handgrad's optimizers are torch.optim.Optimizer subclasses, so torch's schedulers drive them unchanged)."""
from __future__ import annotations

import torch

from .config import TrainConfig


def make_scheduler(opt: torch.optim.Optimizer, config: TrainConfig, steps_per_epoch: int):
    """-> an LRScheduler for ``config.schedule``, or None for a constant rate."""
    total = steps_per_epoch * config.epochs
    if config.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    if config.schedule == "onecycle":
        # Warm up from lr/25 to lr over the first 30% of the steps, anneal to lr/1e4; no momentum cycling, so
        # every optimizer (SGD without momentum, Adagrad) takes it.
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=total, cycle_momentum=False)
    return None
