"""Synchronised batch norm for data-parallel training: the batch statistics, and the two gradient sums of
the backward, all-reduced over the processes, so N processes with a shard each compute the batch norm of
the whole global batch.  Plus ``convert_sync_batchnorm``, which swaps it in for BatchNorm1d/2d in a model.

Shape legend as in layers/batchnorm.py: x is (N, C, *), M = the values per channel; here N and M are
this process's (local) sizes, and M_g = the sum of M over the process group (the global count).
"""

from __future__ import annotations

from typing import overload

import torch
import torch.distributed as dist
from torch import Tensor

import kernels

from .batchnorm import _BatchNorm
from .checks import Expects
from .layer import Layer
from .sequential import Sequential


class SyncBatchNorm(_BatchNorm):
    """Batch norm over (N, C, *) whose training-mode statistics span every process of ``process_group``
    (default: the WORLD group), written with plain ``torch.distributed.all_reduce`` calls.

    Forward (training): all_reduce [sum(x) per channel, M] -> M_g and mean = sum / M_g; then
    all_reduce sum((x - mean)^2) -> biased var = that / M_g.  Two all-reduces of C+1 and C numbers,
    the two-pass variance (no sum(x^2)/M - mean^2 cancellation); the running estimates are updated
    with var * M_g / (M_g - 1), identically on every rank (they stay equal across ranks).
    Backward: the compact batch-norm formula (layers/batchnorm.py) needs sum(dout) and
    sum(dout * xhat) over the global batch: one all_reduce of those 2C numbers, then
        dx = gamma * invstd * (dout - sum_g(dout)/M_g - xhat * sum_g(dout * xhat)/M_g).
    dgamma and dbeta are this process's LOCAL sums, as in torch's SyncBatchNorm: the data-parallel
    gradient all-reduce (training/parallel/allreduce.py, or DDP) adds them up with every other gradient.

    When it synchronises -- as torch.nn.SyncBatchNorm decides: in training mode (batch statistics) with
    torch.distributed initialised and more than one process in the group.  Otherwise (not initialised, a
    group of one, eval mode) it is exactly BatchNorm: local batch statistics, or the running ones in eval.
    Unlike torch's, it runs on CPU tensors too (gloo), and torch's N*spatial > 1 check is applied only when
    not synchronising (the global count is on the device; checking it would need a host sync).  A rank may
    hold an empty shard (N = 0) and still takes part.  The global count is carried in the statistics
    dtype: exact up to 2^24 values per channel in float32 (2^53 in float64).
    """

    torch_class = torch.nn.SyncBatchNorm
    _ctor_args = ("num_features", "eps", "momentum", "affine", "track_running_stats", "process_group", "bias")
    expects = Expects(
        dims=tuple(range(2, 9)),
        size=(1, "num_features"),
        like=("weight", "running_mean"),
        half=True,
        shape="(N, {num_features}, *)",
    )  # any (N, C, *) as torch's SyncBatchNorm

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: dist.ProcessGroup | None = None,
        *,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, bias=bias, device=device, dtype=dtype
        )
        self.process_group = process_group

    def _world_size(self) -> int:
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self.process_group)

    def _synchronises(self) -> bool:
        """Batch statistics across the group: in training, with more than one process (N may differ from rank
        to rank, 0 too).  The forward's answer holds for its backward (``_syncing``)."""
        return self.training and self._world_size() > 1

    def _local(self) -> bool:
        """Not synchronising, the two hooks below are the base class's: the C++ kernel may run."""
        return not self._syncing

    def _check_batch(self, x: Tensor, count: int) -> None:
        if not self._syncing:
            super()._check_batch(x, count)

    def _batch_stats(
        self, x: Tensor, dims: tuple[int, ...], scratch: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, int | Tensor]:
        if not self._syncing:
            return super()._batch_stats(x, dims, scratch)
        c = self.num_features
        bshape = (1, c) + (1,) * (x.dim() - 2)
        sums = torch.cat([x.sum(dims), x.new_full((1,), x.numel() // max(c, 1))])  # (C+1,) [sum(x), M]
        dist.all_reduce(sums, group=self.process_group)  # over the ranks: [sum_g(x), M_g]
        count = sums[c]  # M_g, a 0-dim tensor on the device
        mean = sums[:c] / count  # (C,)
        xc = x - mean.view(bshape)  # (N, C, *) centred on the GLOBAL mean
        sq = (xc * xc).sum(dims)  # (C,)
        dist.all_reduce(sq, group=self.process_group)
        return mean, xc, sq / count, count  # mean, x - mean, biased var, M_g

    def _reduce_grad_sums(self, sum_dout: Tensor, sum_dout_xhat: Tensor, count: int | Tensor) -> tuple[Tensor, Tensor]:
        if not self._syncing:
            return sum_dout, sum_dout_xhat
        both = torch.cat([sum_dout, sum_dout_xhat])  # (2C,) one all-reduce for the two
        dist.all_reduce(both, group=self.process_group)
        return both[: self.num_features], both[self.num_features :]

    def backward_math(self, dout: Tensor, saved):
        """BatchNorm's backward; while synchronising, its textbook statement with the two sums and the count M_g over
        every process's batch (the kernel all-reduces the same two sums, ``_reduce_grad_sums``)."""
        if kernels.enabled() or not saved.batch_stats or not self._syncing:
            return super().backward_math(dout, saved)
        xhat = saved.xc.movedim(1, -1).reshape(-1, self.num_features) * saved.rstd  # (M, C)
        dout = dout.to(xhat.dtype).movedim(1, -1).reshape(-1, self.num_features)  # (M, C)
        weight = saved.rstd.new_ones(self.num_features) if self.weight is None else self.weight.to(xhat.dtype)
        dweight, dbias = (dout * xhat).sum(0), dout.sum(0)  # (C,) this process's own, as torch's
        dx = None
        if self.needs_input_grad:  # (else no all-reduce, as torch skips it)
            dxhat, n = dout * weight, saved.count  # (M, C); M_g
            sum_dxhat, sum_dxhat_xhat = self._reduce_grad_sums(dxhat.sum(0), (dxhat * xhat).sum(0), n)
            dx = saved.rstd / n * (n * dxhat - sum_dxhat - xhat * sum_dxhat_xhat)  # (M, C)
            dx = dx.view(saved.xc.shape[0], *saved.xc.shape[2:], self.num_features).movedim(-1, 1).to(saved.dtype)
        grads = {
            "weight": None if self.weight is None else dweight.to(self.weight.dtype),
            "bias": None if self.bias is None else dbias.to(self.bias.dtype),
        }
        return dx, grads

    @classmethod
    def _from_batchnorm(cls, bn: _BatchNorm, process_group: dist.ProcessGroup | None) -> SyncBatchNorm:
        """A SyncBatchNorm holding the very tensors of ``bn`` (so an optimizer built on them keeps working)."""
        with torch.random.fork_rng(devices=[]):
            sync = cls(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats, process_group)
        for name in (*cls._param_names, *cls._buffer_names):
            setattr(sync, name, getattr(bn, name))
        return sync.train(bn.training)


@overload
def convert_sync_batchnorm(model: Sequential, process_group: dist.ProcessGroup | None = None) -> Sequential: ...
@overload
def convert_sync_batchnorm(model: Layer, process_group: dist.ProcessGroup | None = None) -> Layer: ...
def convert_sync_batchnorm(
    model: Layer | Sequential, process_group: dist.ProcessGroup | None = None
) -> Layer | Sequential:
    """Every BatchNorm1d/BatchNorm2d in ``model`` (a layer or a Sequential, nested allowed) replaced by a
    SyncBatchNorm over ``process_group`` that holds the same parameter and buffer tensors, as
    ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` does.  A Sequential is changed in place and
    returned; a lone batch-norm layer comes back as a new SyncBatchNorm; anything else is returned as is."""
    if isinstance(model, _BatchNorm) and not isinstance(model, SyncBatchNorm):
        return SyncBatchNorm._from_batchnorm(model, process_group)
    if isinstance(model, Sequential):
        for i, child in enumerate(model.layers):
            model.layers[i] = convert_sync_batchnorm(child, process_group)
    return model
