"""Batch normalisation, BatchNorm1d and BatchNorm2d, with the compact closed-form backward.

Shape legend (see layers/layer.py): N = batch, C = channels (num_features), L = sequence length,
H, W = image height and width.  Statistics are per channel, over every other axis:
M = N (for (N, C)), N*L (for (N, C, L)) or N*H*W (for (N, C, H, W)) values per channel.

The two reductions that cross the batch -- the statistics in the forward, the two gradient sums in
the backward -- are methods of their own (``_batch_stats``, ``_reduce_grad_sums``), so that
``SyncBatchNorm`` (layers/sync_batchnorm.py) only all-reduces them across processes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

import kernels
from kernels import norms

from .checks import LOW_PRECISION, Expects, check_bool, check_int, check_number
from .layer import BaseLayer, learned


class _BatchNorm(BaseLayer):
    """out = gamma * xhat + beta,  xhat = (x - mean) / sqrt(var + eps), statistics per channel.

    Training mode (or ``track_running_stats=False``): mean and var are the batch's, var BIASED
    (divided by M), as torch normalises; the running estimates are updated with the UNBIASED
    variance var * M / (M - 1), as torch does:
        running = (1 - momentum) * running + momentum * batch_statistic
    with ``momentum=None`` meaning the cumulative average (momentum = 1 / num_batches_tracked).
    Eval mode with running statistics: mean and var are running_mean and running_var, and the layer
    is the per-channel affine map  out = x * scale + shift.

    Backward in training mode, derived on paper (CS231n's batchnorm_backward_alt; makemore's
    "Becoming a Backprop Ninja").  Per channel, with sums over the M values of that channel,
    mu = sum(x)/M, var = sum((x - mu)^2)/M, rstd = 1/sqrt(var + eps), xhat = (x - mu) * rstd,
    out = gamma * xhat + beta, and dxhat = gamma * dout.  x reaches xhat three ways -- directly, through mu and
    through var --, one term each:

        dbeta  = sum(dout)                       dgamma = sum(dout * xhat)
        dvar   = sum(dxhat * (x - mu)) * (-1/2) * rstd^3 = -(1/2) * rstd^2 * sum(dxhat * xhat)
                                                                   [x - mu = xhat / rstd]
        dmu    = -rstd * sum(dxhat) + dvar * (-2/M) * sum(x - mu) = -rstd * sum(dxhat)   [sum(x - mu) = 0]
        dx     = dxhat * rstd  +  dvar * 2 (x - mu) / M  +  dmu / M        (term 1: direct; 2: var; 3: mu)
               = rstd / M * (M * dxhat - sum(dxhat) - xhat * sum(dxhat * xhat))

    One statement.  The backward below writes it on rows, the channels last: (N, C, ...) as (M, C).  The kernel
    (kernels/norms.py) keeps x - mu (not xhat) from the forward and evaluates the statement in place in one
    buffer, as scale * dout + a + (x - mu) * b with per-channel scale = gamma * rstd, a and b.
    Eval mode (running statistics): mean and var are constants, dx = dxhat * rstd, the affine map's backward.

    Mixed precision: a float16/bfloat16 input is accepted with float32 (or matching) parameters, as
    torch accepts it; the statistics, the normalisation and the gradient sums are then computed in float32, and
    the output and dx are returned in the input's dtype.

    Kept from forward to backward: x - mean (training: the layer's own) or, in eval mode, x itself and a copy of
    running_mean; and gamma * rstd, computed from the weight.  A change of x or of the weight in place in between
    (an optimizer step before backward) is refused, as torch.autograd refuses it (layers/saved.py).  The C++
    kernel's forward (kernels/norms.py) keeps x and the batch's mean in training too: its backward makes x - mean
    again in the pass that reads x.
    Written in the template (layers/template.py): the base checks, keeps, versions and accumulates.
    """

    _param_names = ("weight", "bias")
    _buffer_names = ("running_mean", "running_var", "num_batches_tracked")
    _saved_labels = {"xc": "its input x"}  # x - mean, the layer's own copy of x centred: named as x
    _syncing = False  # whether this forward's statistics span processes (SyncBatchNorm; its backward's too)
    _ctor_args: tuple[str, ...] = ("num_features", "eps", "momentum", "affine", "track_running_stats", "bias")

    class Saved(NamedTuple):
        xc: Tensor | None  # (N, C, ...) x - mean, training (xhat = xc * rstd is never stored); else None
        x: Tensor | None  # (N, C, ...) x itself, eval or the C++ forward (x - mean made again); else None
        weight: Tensor | None  # (C,) gamma, read into scale: its change in place is refused
        mean: Tensor  # (C,) the batch's, or a copy of running_mean
        rstd: Tensor  # (C,) 1 / sqrt(var + eps)
        scale: Tensor  # (C,) gamma * rstd
        # M, the values per channel (SyncBatchNorm: the global M_g, on the device); None in eval
        count: int | Tensor | None  # type: ignore[assignment]  # (shadows tuple.count, which is not used)
        batch_stats: bool  # normalised by the batch's statistics (training, or no running ones)
        dtype: torch.dtype  # x's, given back to dx (the sums run in float32 for float16/bfloat16)

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        *,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        owner = type(self).__name__
        self.num_features = check_int(owner, "num_features", num_features)
        self.eps = check_number(owner, "eps", eps, 0.0)
        self.momentum = None if momentum is None else check_number(owner, "momentum", momentum, 0.0, 1.0)
        for name, flag in (("affine", affine), ("track_running_stats", track_running_stats), ("bias", bias)):
            check_bool(owner, name, flag)
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"{owner}: dtype must be floating point, got {dtype}")
        self.affine, self.track_running_stats = affine, track_running_stats
        kw: dict[str, Any] = {"device": device, "dtype": dtype if dtype is not None else torch.get_default_dtype()}
        # torch.nn's initial values: no random draws.
        self.weight = torch.ones(num_features, **kw) if affine else None  # (C,) gamma
        self.bias = torch.zeros(num_features, **kw) if affine and bias else None  # (C,) beta (torch 2.x: bias=False)
        learned(self.weight, self.bias)
        if track_running_stats:
            self.running_mean = torch.zeros(num_features, **kw)  # (C,)
            self.running_var = torch.ones(num_features, **kw)  # (C,)
            self.num_batches_tracked = torch.zeros((), dtype=torch.long, device=device)
        else:
            # (typed as tensors: every read of them is under track_running_stats, or a check of None)
            self.running_mean = self.running_var = self.num_batches_tracked = None  # type: ignore[assignment]

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}"
        )  # torch's repr

    # -- the two cross-batch reductions (SyncBatchNorm overrides these) ----------------------------------

    def _batch_stats(
        self, x: Tensor, dims: tuple[int, ...], scratch: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, int | Tensor]:
        """x (in the statistics dtype) -> (mean (C,), xc = x - mean (x's shape), biased var (C,), M).
        ``scratch``: a buffer of x's shape the squares may be written into (the forward's output, next).

        Two passes from per-channel sums: mean = sum(x) / M, then var = sum(xc * xc) / M -- numerically
        good (no cancellation as in sum(x^2)/M - mean^2), and xc is what both the output and the backward
        use (and faster on the CPU than torch.var_mean over several axes: docs/benchmarks.md)."""
        count = x.numel() // x.shape[1]
        bshape = (1, x.shape[1]) + (1,) * (x.dim() - 2)
        if count == 0:  # an empty batch (torch returns an empty output): mean 0 and var 1, so every sum is 0
            mean = x.new_zeros(x.shape[1])  # and nothing is 0/0 (nor 0 * inf with eps = 0)
            return mean, x - mean.view(bshape), x.new_ones(x.shape[1]), 0
        mean = x.sum(dims) / count  # (C,)
        xc = x - mean.view(bshape)  # (N, C, ...)
        squares = torch.mul(xc, xc) if scratch is None else torch.mul(xc, xc, out=scratch)
        var = squares.sum(dims) / count  # (C,)
        return mean, xc, var, count

    def _synchronises(self) -> bool:
        """Whether this forward's batch statistics span processes (here: never)."""
        return False

    def _local(self) -> bool:
        """Whether the statistics and the backward's two sums are this process's own, as the two hooks above
        compute them -- not synchronised, neither hook replaced --, so that the C++ kernel may compute each with
        the pass that uses it, in one call."""
        hooks = (self._batch_stats, self._reduce_grad_sums)
        base = (_BatchNorm._batch_stats, _BatchNorm._reduce_grad_sums)
        return not self._syncing and all(getattr(h, "__func__", None) is b for h, b in zip(hooks, base, strict=True))

    def _reduce_grad_sums(self, sum_dout: Tensor, sum_dout_xhat: Tensor, count: int | Tensor) -> tuple[Tensor, Tensor]:
        """The per-channel sums dx needs, over the whole batch (here: this process's batch is the batch)."""
        return sum_dout, sum_dout_xhat

    def _check_batch(self, x: Tensor, count: int) -> None:
        """torch's rule: one value per channel has no variance to normalise by; none at all (an empty batch) is
        accepted, as torch accepts it (an empty output, zero parameter gradients)."""
        if count == 1:
            raise ValueError(
                f"{self!r}: expected more than 1 value per channel when training, got input of shape {tuple(x.shape)}"
            )

    # -- forward and backward ----------------------------------------------------------------------------

    def forward_math(self, x: Tensor):
        """x: (N, C) or (N, C, L) [BatchNorm1d], (N, C, H, W) [BatchNorm2d] -> out: same shape."""
        self._syncing = self._synchronises()
        dims = (0, *range(2, x.dim()))  # every axis but the channel axis
        bshape = (1, self.num_features) + (1,) * (x.dim() - 2)  # (1, C[, 1[, 1]]): broadcasts over dims
        sdtype = torch.float32 if x.dtype in LOW_PRECISION else x.dtype  # statistics dtype
        xs = x if x.dtype == sdtype else x.to(sdtype)
        batch_stats = self.training or self.running_mean is None
        if batch_stats:
            if not self.eps > 0:  # a constant channel would give 0/0; torch refuses it too (eval may use eps=0)
                raise ValueError(
                    f"{self!r}: eps must be positive to normalise by batch statistics (training, or "
                    f"track_running_stats=False), got eps={self.eps}"
                )
            if self.training:
                self._check_batch(x, x.numel() // x.shape[1])
            # the same statistics and output in one C++ call (kernels/norms.py), or None: the lines below
            local = kernels.enabled() and self._local()
            fused = norms.batch_norm_forward(xs, self.weight, self.bias, self.eps) if local else None
            if fused is not None:
                return self._fused_forward(x, xs, *fused)
            # The squares for the variance first, then the output, in one buffer: one allocation fewer (not while
            # autograd traces the forward, gradcheck's comparison: out= arguments are not differentiable).
            out = None if xs.requires_grad else torch.empty_like(xs)
            mean, xc, var, count = self._batch_stats(xs, dims, out)  # (C,), (N, C, ...), (C,), M
            if self.training and self.running_mean is not None:
                self._update_running(mean, var, count)
        else:  # running_mean copied: the backward reads it, and the buffer may be rewritten before then
            # (as_module's re-run writes the same values back, which a version check could not tell from a change)
            mean, xc, var, count = self.running_mean.to(sdtype, copy=True), None, self.running_var.to(sdtype), None
        rstd = torch.rsqrt(var + self.eps)  # (C,)
        scale = rstd if self.weight is None else self.weight.to(sdtype) * rstd  # (C,) gamma * rstd
        if xc is not None:  # out = xc * gamma * rstd + beta
            out = xc * scale.view(bshape) if out is None else torch.mul(xc, scale.view(bshape), out=out)  # (N, C, ...)
            if self.bias is not None:
                out.add_(self.bias.to(sdtype).view(bshape))
        else:  # eval: out = x * scale + (beta - mean * scale), one pass, as torch's own CPU kernel computes it
            shift = -mean * scale if self.bias is None else self.bias.to(sdtype) - mean * scale  # (C,)
            out = torch.addcmul(shift.view(bshape), xs, scale.view(bshape))  # (N, C, ...)
        out = out if out.dtype == x.dtype else out.to(x.dtype)
        return out, self.Saved(
            xc, xs if xc is None else None, self.weight, mean, rstd, scale, count, batch_stats, x.dtype
        )

    def _fused_forward(self, x: Tensor, xs: Tensor, out: Tensor, mean: Tensor, var: Tensor, rstd: Tensor):
        """What forward_math returns after the C++ kernel's forward: the running statistics updated as below, and
        x itself kept with mean (no x - mean: the kernel's backward reads x and mean again)."""
        count = xs.numel() // xs.shape[1]
        if self.training and self.running_mean is not None:
            self._update_running(mean, var, count)
        scale = rstd if self.weight is None else self.weight * rstd  # (C,) gamma * rstd
        out = out if out.dtype == x.dtype else out.to(x.dtype)
        return out, self.Saved(None, xs, self.weight, mean, rstd, scale, count, True, x.dtype)

    def _update_running(self, mean: Tensor, var: Tensor, count: int | Tensor) -> None:
        """running = (1 - f) * running + f * statistic, f = momentum or 1 / num_batches_tracked (momentum=None);
        the variance in the running estimate is unbiased (var * M / (M - 1)), as torch keeps it."""
        self.num_batches_tracked.add_(1)  # on the device: no host sync
        if isinstance(count, int) and count == 0:  # an empty batch: counted, but no statistic to average in
            return  # (torch likewise counts it in num_batches_tracked and leaves the running estimates)
        f = self.momentum if self.momentum is not None else 1.0 / self.num_batches_tracked.to(self.running_mean.dtype)
        unbiased = var * (count / (count - 1))  # (C,)
        rm, rv = self.running_mean, self.running_var
        rm.mul_(1 - f).add_(f * mean.to(rm.dtype))
        rv.mul_(1 - f).add_(f * unbiased.to(rv.dtype))

    def backward_math(self, dout: Tensor, saved: Saved):
        """dout: shape of out -> dx: shape of x; dweight (C,) and dbias (C,), added into weight.grad, bias.grad."""
        if kernels.enabled():  # the same statement in one buffer: kernels/norms.py
            dx, dweight, dbias = norms.batch_norm_backward(
                dout,
                saved,
                needs_dx=self.needs_input_grad,
                affine=self.weight is not None,
                reduce=self._reduce_grad_sums,
                local=self._local(),
            )
            return _as(dx, saved.dtype), {"weight": _as_like(dweight, self.weight), "bias": _as_like(dbias, self.bias)}
        # x - mean: kept in training (xc), recomputed where x was kept (eval; the C++ forward's training)
        x: Tensor = saved.xc if saved.xc is not None else saved.x - saved.mean.view(_bshape(saved.x))  # type: ignore
        xhat, dout, rstd = _rows(x) * saved.rstd, _rows(dout.to(x.dtype)), saved.rstd  # (M, C), (M, C), (C,)
        weight = rstd.new_ones(rstd.shape) if self.weight is None else self.weight.to(rstd.dtype)  # (C,)
        n = dout.shape[0]
        dweight = (dout * xhat).sum(0)  # (C,)
        dbias = dout.sum(0)  # (C,)
        dxhat = dout * weight  # (M, C)
        if saved.batch_stats:  # x reaches xhat directly, through the mean and through the variance: one term each
            dx = rstd / n * (n * dxhat - dxhat.sum(0) - xhat * (dxhat * xhat).sum(0))  # (M, C)
        else:  # eval with running statistics: mean and var are constants, the affine map's backward
            dx = dxhat * rstd
        return _as(_unrows(dx, x.shape), saved.dtype), {
            "weight": _as_like(dweight, self.weight),
            "bias": _as_like(dbias, self.bias),
        }


def _bshape(x: Tensor) -> tuple[int, ...]:
    """(1, C, 1, ...): a (C,) tensor viewed to broadcast over x (N, C, ...)."""
    return (1, x.shape[1]) + (1,) * (x.dim() - 2)


def _rows(x: Tensor) -> Tensor:
    """(N, C, ...) -> (M, C): the channels last, every other axis flattened into the M rows."""
    return x.movedim(1, -1).reshape(-1, x.shape[1])


def _unrows(rows: Tensor, shape: torch.Size) -> Tensor:
    """(M, C) -> (N, C, ...) of ``shape``: ``_rows`` undone."""
    return rows.view(shape[0], *shape[2:], shape[1]).movedim(-1, 1)


def _as(t: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """t in ``dtype`` (a float16/bfloat16 input's gradient comes back in its dtype from the float32 sums)."""
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _as_like(t: Tensor | None, param: Tensor | None) -> Tensor | None:
    """A parameter gradient in its parameter's dtype; None for an absent parameter (whose gradient is None)."""
    return None if param is None or t is None else _as(t, param.dtype)


class BatchNorm1d(_BatchNorm):
    __doc__ = "Batch norm over (N, C) or (N, C, L): statistics per channel over N (and L).\n\n" + (
        _BatchNorm.__doc__ or ""
    )
    torch_class = torch.nn.BatchNorm1d
    expects = Expects(
        dims=(2, 3),
        size=(1, "num_features"),
        like=("weight", "running_mean"),
        half=True,
        shape="(N, {num_features}) or (N, {num_features}, L)",
    )


class BatchNorm2d(_BatchNorm):
    __doc__ = "Batch norm over (N, C, H, W): statistics per channel over N, H and W.\n\n" + (_BatchNorm.__doc__ or "")
    torch_class = torch.nn.BatchNorm2d
    expects = Expects(
        dims=(4,),
        size=(1, "num_features"),
        like=("weight", "running_mean"),
        half=True,
        shape="(N, {num_features}, H, W)",
    )
