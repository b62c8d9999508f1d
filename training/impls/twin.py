"""torch: the nn.Module twin, autograd's backward and torch.optim's optimizer, as PyTorch users train.

Mixed precision: float32 weights, forward and loss under ``torch.autocast``, ``torch.amp.GradScaler`` for float16:
PyTorch's own recipe, for comparison with the hand-written one.  Under torchrun: DistributedDataParallel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from optimizers import OPTIMIZERS

from ..compiled import CompileTimer
from ..config.optim import OptimConfig
from ..config.run import RunConfig
from ..parallel.distributed import SINGLE, DistInfo
from .optim_setup import aux_loss, clip_monitored, optimizer_kwargs, param_groups, rows


class TorchImpl:
    name = "torch"
    sched: torch.optim.lr_scheduler.LRScheduler | None = None
    monitor = None
    autocast = None  # mixed precision: the half dtype torch.autocast runs forward and loss in
    scaler = None  # float16: torch.amp.GradScaler
    compiled = None  # --compile: the step around the compiled model, timed (training/compiled.py)

    def __init__(self, model: torch.nn.Module, optim: OptimConfig, run: RunConfig, info: DistInfo = SINGLE):
        self.model = model
        cls = getattr(torch.optim, OPTIMIZERS[optim.optimizer].__name__)  # handgrad's twin in torch.optim
        self.opt = cls(param_groups(list(model.named_parameters()), optim), **optimizer_kwargs(optim))
        self.clip = optim.clip_grad
        self.world = info.world_size if info.enabled else None
        # Under torchrun the twin trains as PyTorch users train: DistributedDataParallel (it averages over ranks).
        self.forward: Callable[..., Any] = torch.nn.parallel.DistributedDataParallel(model) if info.enabled else model
        if run.compile:  # as PyTorch users compile: the model (autograd's backward compiled with it)
            self.forward = torch.compile(model)
            self.compiled = CompileTimer(self._step, next(model.parameters()).device)
        if run.is_mixed:
            self.autocast = run.compute_dtype
            self.device_type = next(model.parameters()).device.type
            if run.compute_dtype == torch.float16:
                self.scaler = torch.amp.GradScaler(self.device_type)

    def train_step(self, x, y, total, step=0):
        if self.autocast is not None:
            return self._autocast_step(x, y, step)
        if self.compiled is not None:
            return self.compiled(x, y, total, step)
        return self._step(x, y, total, step)

    def _step(self, x, y, total, step):
        self.opt.zero_grad()
        logits = self.forward(x)
        if self.world is None:
            loss = F.cross_entropy(*rows(logits, y))
            aux = aux_loss(self.model)  # a mixture of experts' load-balancing term
            loss = loss if aux is None else loss + aux
            loss.backward()
            loss_sum = loss.detach() * y.numel()
        else:
            loss_sum = F.cross_entropy(*rows(logits, y), reduction="sum")
            (loss_sum * (self.world / total)).backward()  # DDP divides by the world size: the global mean remains
            loss_sum = loss_sum.detach()
        norm = clip_monitored(self, step, torch.nn.utils.clip_grad_norm_)
        self.opt.step()
        return loss_sum, logits.detach(), norm

    def _autocast_step(self, x, y, step):
        """PyTorch's recipe: forward and loss under autocast (cross-entropy runs in float32 there), GradScaler for
        float16, gradients unscaled before they are monitored and clipped."""
        self.opt.zero_grad()
        with torch.autocast(self.device_type, dtype=self.autocast):
            logits = self.forward(x)  # (N, C) half
            loss = F.cross_entropy(*rows(logits, y))  # float32
        scaler = self.scaler
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(self.opt)
        norm = clip_monitored(self, step, torch.nn.utils.clip_grad_norm_)
        if scaler is None:
            self.opt.step()
        else:
            scaler.step(self.opt)
            scaler.update()
        return loss.detach() * y.numel(), logits.detach().float(), norm

    @torch.no_grad()
    def eval_batch(self, x, y):
        if self.autocast is not None:
            with torch.autocast(self.device_type, dtype=self.autocast):
                logits = self.model(x)
                return F.cross_entropy(*rows(logits, y), reduction="sum"), logits.float()
        logits = self.model(x)
        return F.cross_entropy(*rows(logits, y), reduction="sum"), logits

    def named_parameters(self):
        return list(self.model.named_parameters())
