"""Synchronised batch norm for the nn.Module twin, wherever it runs.

torch's nn.SyncBatchNorm synchronises only CUDA tensors ("SyncBatchNorm layers only work with GPU modules"), so on
the CPU (gloo) the twin uses ``GlooSyncBatchNorm``: the same statistics over every rank's part of the batch, from
torch operations and ``all_reduce_sum``, an all-reduce that autograd differentiates (its backward is the all-reduce
of the gradients; torch.distributed.nn.functional.all_reduce, which did this, is deprecated).  The hand-written
model's own ``layers.SyncBatchNorm`` is what is checked; this is autograd's reference for it, as nn.SyncBatchNorm
is on CUDA.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor, nn


class _AllReduceSum(torch.autograd.Function):
    """y = the sum of x over every rank.  Each rank's loss uses its y, and the loss trained is their sum, so
    dL/dx on a rank is the sum over ranks of dL/dy: the backward is the same all-reduce."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, dy: Tensor) -> Tensor:
        dx = dy.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(dx)
        return dx


def all_reduce_sum(x: Tensor) -> Tensor:
    """The sum of ``x`` over every rank, differentiable (a new tensor; ``x`` is unchanged)."""
    return _AllReduceSum.apply(x)


class GlooSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """nn.BatchNorm1d/2d whose training-mode statistics are those of the global batch (any device, any backend)."""

    def _check_input_dim(self, x: Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"GlooSyncBatchNorm: expected at least 2-D input, got {tuple(x.shape)}")

    def forward(self, x: Tensor) -> Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        local = torch.cat([x.sum(dims), x.new_full((1,), x.numel() // x.shape[1])])  # (C + 1,)
        total = all_reduce_sum(local)  # sums over every rank
        n = total[-1]
        mean = total[:-1] / n  # (C,)
        centred = x - mean.view(shape)
        var = all_reduce_sum((centred * centred).sum(dims)) / n  # (C,) biased
        out = centred / torch.sqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:  # then torch's _BatchNorm made the three buffers
            count = cast(Tensor, self.num_batches_tracked)
            running_mean, running_var = cast(Tensor, self.running_mean), cast(Tensor, self.running_var)
            with torch.no_grad():
                count += 1  # in place: the buffer itself
                m = 1.0 / count.item() if self.momentum is None else self.momentum
                running_mean.mul_(1 - m).add_(mean, alpha=m)
                running_var.mul_(1 - m).add_(var * n / (n - 1), alpha=m)  # unbiased, as torch
        return out


def sync_batchnorm_twin(module: nn.Module, device: torch.device) -> nn.Module:
    """Every BatchNorm1d/2d of ``module`` made synchronised: nn.SyncBatchNorm on CUDA, GlooSyncBatchNorm otherwise.
    Same parameters, buffers and state_dict keys; in place where possible; returns the module."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    for m in module.modules():
        if type(m) in (nn.BatchNorm1d, nn.BatchNorm2d):
            m.__class__ = GlooSyncBatchNorm
    return module
