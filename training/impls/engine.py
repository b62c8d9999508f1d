"""engine: the MLP on handgrad's autodiff engine (gradients from per-operation closures), a handgrad optimizer."""

from __future__ import annotations

import torch

from autodiff import cross_entropy, no_grad
from optimizers import clip_grad_norm_, get_optimizer

from ..config.optim import OptimConfig
from ..config.run import RunConfig
from ..parallel.allreduce import GradBuckets
from ..parallel.distributed import SINGLE, DistInfo
from .optim_setup import clip_monitored, optimizer_kwargs


class EngineImpl:
    name = "engine"
    sched: torch.optim.lr_scheduler.LRScheduler | None = None
    monitor = None

    def __init__(self, model, optim: OptimConfig, run: RunConfig, info: DistInfo = SINGLE):
        self.model = model
        self.opt = get_optimizer(optim.optimizer, model.parameters(), **optimizer_kwargs(optim))
        self.clip = optim.clip_grad
        # The engine's graph has no per-layer hook: its gradients are all-reduced after the whole backward.
        self.buckets = (
            GradBuckets([p.data for p in model.parameters()], scale=1.0, flags=False) if info.enabled else None
        )  # the flags are the engine Tensors', not their .data's

    def train_step(self, x, y, total, step=0):
        self.opt.zero_grad()
        logits = self.model(x)
        if self.buckets is None:
            loss = cross_entropy(logits, y)
            loss.backward()
            loss_sum = loss.data * y.shape[0]
        else:
            loss = cross_entropy(logits, y, reduction="sum")
            (loss * (1.0 / total)).backward()
            self.buckets.reduce_all()
            loss_sum = loss.data
        norm = clip_monitored(self, step, clip_grad_norm_)
        self.opt.step()
        return loss_sum, logits.data, norm

    @no_grad()
    def eval_batch(self, x, y):
        logits = self.model(x)
        return cross_entropy(logits, y, reduction="sum").data, logits.data

    def named_parameters(self):
        return [(name, p.data) for name, p in self.model.named_parameters()]
