"""LayerNorm's and BatchNorm's backwards, arranged for speed: the textbook statement evaluated in place.

layers/layernorm.py and layers/batchnorm.py write each backward as the one statement of its derivation,

    dx = rstd / n * (n * dxhat - sum(dxhat) - xhat * sum(dxhat * xhat)),   dxhat = dout * weight

(sums over a row for LayerNorm, over a channel for BatchNorm) -- a temporary per operation.  Here the same numbers
on as few buffers as possible: LayerNorm's as a chain of in-place passes over dxhat's memory (or one compiled pass,
kernels/compiled.py, where on); BatchNorm's as ``scale * dout + a + (x - mean) * b`` with per-channel scale =
weight * rstd, a and b, written into the one buffer that held dout * (x - mean).  Neither keeps xhat from the
forward: it is (x - mean) * rstd, made again where needed.  For float32/float64 CPU tensors LayerNorm's backward is
the C++ kernel of kernels/cpp/norms.cpp: the same statement, a row in two passes while it is in cache; and so are
BatchNorm's forward with the batch's statistics (``batch_norm_forward``: mean, variance and output, a channel in
three passes while it is in cache) and its backward (the two sums and dx, a channel in two passes), for a
contiguous (N, C, ...) input whose statistics this process alone computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from . import compiled, cpp


def layer_norm_backward(
    dout: Tensor,
    x: Tensor,
    mean: Tensor,
    rstd: Tensor,
    xhat: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    dims: tuple[int, ...],
    *,
    needs_dx: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """dout, x (*, S), mean and rstd (*, 1...) per row, xhat (float32, kept for a half-precision x) or None,
    weight and bias (S,) or None, ``dims`` the row's axes -> (dx (*, S) or None, dweight (S,), dbias (S,))."""
    k = math.prod([x.shape[d] for d in dims])  # the values of one row (a list: torch.compile traces no generator)
    if xhat is None and cpp.usable(dout, x, mean, rstd, *(() if weight is None else (weight,))):
        # the same statement, a row in two passes while in cache: kernels/cpp/norms.cpp
        dx, dweight, dbias = cpp.ops.layer_norm_backward(
            dout.reshape(-1, k).contiguous(),
            x.reshape(-1, k).contiguous(),
            mean.reshape(-1).contiguous(),
            rstd.reshape(-1).contiguous(),
            None if weight is None else weight.reshape(k).contiguous(),
        )
        if weight is None:
            dweight = dbias = None
        else:
            dweight, dbias = dweight.view(weight.shape), None if bias is None else dbias.view(bias.shape)
        return (dx.view(x.shape) if needs_dx else None), dweight, dbias
    if xhat is None and weight is not None and needs_dx and compiled.usable(dout, x, weight):
        k = weight.numel()  # the textbook's formulas as one compiled pass (kernels/compiled.py), where on
        grads = compiled.layer_norm_backward(
            dout.reshape(-1, k), x.reshape(-1, k), mean.reshape(-1, 1), rstd.reshape(-1, 1), weight.reshape(k)
        )
        if grads is not None:
            cdx, cdw, cdb = grads
            return cdx.view(x.shape), cdw.view(weight.shape), None if bias is None else cdb.view(bias.shape)
    if xhat is None:
        xhat = torch.sub(x, mean).mul_(rstd)  # (*, S) recomputed from the kept input
    d = dout.to(xhat.dtype)  # (*, S)
    lead = tuple(range(x.dim() - len(dims)))  # the axes gamma and beta are shared over
    d_xhat = d * xhat  # (*, S)
    dweight = dbias = None
    if weight is not None:
        dweight = d_xhat.sum(lead).to(weight.dtype)  # (S,)
        dbias = None if bias is None else d.sum(lead).to(bias.dtype)  # (S,)
    if not needs_dx:
        return None, dweight, dbias
    if weight is None:  # gamma = 1
        dxhat, dxhat_xhat = d.clone(), d_xhat  # (*, S) each
    else:
        w = weight.to(d.dtype)
        dxhat, dxhat_xhat = d * w, d_xhat.mul_(w)  # (*, S) each
    # dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), in dxhat's memory
    m2 = dxhat_xhat.mean(dims, keepdim=True)  # (*, 1...)
    dx = dxhat.sub_(dxhat.mean(dims, keepdim=True)).addcmul_(xhat, m2, value=-1).mul_(rstd)  # (*, S)
    return dx.to(x.dtype), dweight, dbias


def batch_norm_forward(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """BatchNorm's forward with the batch's statistics, x (N, C, ...) with more than one value per channel ->
    (out (N, C, ...), mean, biased var, rstd (C,)) by the C++ kernel (kernels/cpp/norms.cpp: the layer's two-pass
    statistics and its out = (x - mean) * (weight * rstd) + bias, a channel while it is in cache); None where it
    does not apply (not a contiguous CPU float32/float64 x with at least one axis after the channels, its
    parameters of x's dtype): the layer's own forward then runs.  Nothing of x - mean is stored: the backward
    reads x and mean again."""
    params = tuple(t for t in (weight, bias) if t is not None)
    if x.dim() < 3 or not x.is_contiguous() or x.numel() <= x.shape[1] or not cpp.usable(x, *params):
        return None
    out, mean, var, rstd = cpp.ops.batch_norm_forward(x.view(x.shape[0], x.shape[1], -1), weight, bias, eps)
    return out.view(x.shape), mean, var, rstd


def batch_norm_backward(
    dout: Tensor,
    saved,
    *,
    needs_dx: bool,
    affine: bool,
    reduce: Callable[[Tensor, Tensor, int | Tensor], tuple[Tensor, Tensor]],
    local: bool = False,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """dout (N, C, ...) and what BatchNorm's forward kept (``saved``: ``xc`` = x - mean in training, else ``x`` and
    ``mean`` -- in eval, and in training after the C++ forward, which keeps no x - mean; ``rstd``, ``scale`` =
    weight * rstd (C,), ``count`` M values per channel, ``batch_stats``) -> (dx in the statistics dtype or None,
    dweight (C,), dbias (C,)).  ``affine`` False: no parameters (with no dx asked for, nothing to compute).
    ``reduce``: the two sums over the whole batch (SyncBatchNorm all-reduces them); ``local``: they are this
    process's own (``reduce`` returns them as they are), so the C++ kernel may compute them and dx in one call.

        dx = scale * dout + [-scale * sum(dout) / M] + xc * [-scale * rstd * sum(dout * xhat) / M]

    -- the textbook statement with xhat = xc * rstd, one buffer: dout * xc becomes dx.  Eval with running
    statistics: dx = scale * dout."""
    if not needs_dx and not affine:
        return None, None, None
    t = saved.x if saved.xc is None else saved.xc  # the statistics dtype
    dout = dout if dout.dtype == t.dtype else dout.to(t.dtype)
    if local and saved.batch_stats and saved.xc is None and t.dim() >= 3:  # kept x: the C++ forward ran
        w = saved.weight  # (of x's dtype, as that forward asked)
        if t.is_contiguous() and cpp.usable(dout, t, saved.mean, saved.rstd, *(() if w is None else (w,))):
            N, C = t.shape[:2]  # the sums and dx, a channel in two passes while in cache: kernels/cpp/norms.cpp
            dx, dweight, dbias = cpp.ops.batch_norm_backward(
                dout.contiguous().view(N, C, -1), t.view(N, C, -1), saved.mean, saved.rstd, w, needs_dx
            )
            return (dx.view(t.shape) if needs_dx else None), dweight, dbias
    dims = (0, *range(2, t.dim()))
    bshape = (1, t.shape[1]) + (1,) * (t.dim() - 2)
    xc = t if saved.xc is not None else t - saved.mean.view(bshape)  # (N, C, ...) x - mean
    rstd, scale, count = saved.rstd, saved.scale, saved.count
    sum_dout = dout.sum(dims)  # (C,)  = dbias
    tmp = dout * xc  # (N, C, ...), reused below as dx's memory
    sum_dout_xhat = tmp.sum(dims) * rstd  # (C,)  = dweight
    if not needs_dx:  # dweight and dbias only (nor SyncBatchNorm's all-reduce, as torch skips it)
        return None, sum_dout_xhat, sum_dout
    dx = torch.mul(dout, scale.view(bshape), out=tmp)  # (N, C, ...) weight * rstd * dout
    if saved.batch_stats:  # (eval with running statistics: that is all, the affine map's backward)
        g_dout, g_dout_xhat = reduce(sum_dout, sum_dout_xhat, count)
        dx.add_((-scale * g_dout / count).view(bshape))
        dx.addcmul_(xc, (-scale * rstd * g_dout_xhat / count).view(bshape))
    return dx, sum_dout_xhat, sum_dout
