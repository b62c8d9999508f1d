"""Layer normalisation: each sample normalised over its last dimensions, with a hand-written backward.

Shape legend (see layers/layer.py): the input is (*, S), S = normalized_shape (one or more trailing
axes), * = any leading axes (N, or N and a sequence length, ...); K = prod(S) values per row.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .batchnorm import _LOW_PRECISION, _check_float
from .checks import check_backward_dout, check_floating, check_tensor
from .layer import BaseLayer, accumulate_grad, learned, wants_grad
from .saved import check_versions, versions


class LayerNorm(BaseLayer):
    """out = gamma * xhat + beta,  xhat = (x - mean) / sqrt(var + eps), mean and biased var per row over S.

    Unlike batch norm, the statistics belong to one sample: the same in training and eval mode, no
    running estimates.  Backward, per row, with the K values of a row and dxhat = gamma * dout
    (the batch-norm derivation with the roles of the axes swapped; see layers/batchnorm.py):

        dx     = invstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))      (means over the row)
        dgamma = sum over the leading axes of dout * xhat,   dbeta = sum over the leading axes of dout

    The forward is torch's fused ``native_layer_norm`` (one pass for the statistics, one for the output: a
    forward computation, so nothing of autograd's), which also returns mean and invstd per row; backward
    recomputes xhat = (x - mean) * invstd from them.  Cached: the input x itself, mean and invstd (one per row),
    as torch's LayerNorm keeps them; x, weight and bias (which ``recompute()`` reads too) must not change in place
    before backward (checked, layers/saved.py).
    A float16/bfloat16 input with float32 parameters is accepted (statistics in float32, computed as before
    in two passes, xhat cached), as torch does; without parameters (elementwise_affine=False) any floating
    input is.
    """

    _param_names = ("weight", "bias")
    _kept_names = ("its input x", "weight", "bias")  # (the half-precision path keeps xhat, its own, for x)
    torch_class = torch.nn.LayerNorm
    _ctor_args = ("normalized_shape", "eps", "elementwise_affine", "bias")

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
        try:
            shape = tuple(shape)
        except TypeError:
            shape = None
        if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
            raise ValueError(f"LayerNorm: normalized_shape must be an int >= 1 or a non-empty sequence of them, "
                             f"got {normalized_shape!r}")
        for name, flag in (("elementwise_affine", elementwise_affine), ("bias", bias)):
            if not isinstance(flag, bool):
                raise ValueError(f"LayerNorm: {name} must be a bool, got {flag!r}")
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"LayerNorm: dtype must be floating point, got {dtype}")
        self.normalized_shape = shape
        self.eps = _check_float("LayerNorm", "eps", eps, 0.0)
        self.elementwise_affine = elementwise_affine
        kw = {"device": device, "dtype": dtype if dtype is not None else torch.get_default_dtype()}
        self.weight = torch.ones(shape, **kw) if elementwise_affine else None  # S, gamma
        self.bias = torch.zeros(shape, **kw) if elementwise_affine and bias else None  # S, beta
        learned(self.weight, self.bias)
        self._cache: tuple | None = None

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"

    def forward(self, x: Tensor) -> Tensor:
        """x: (*, S) -> out: (*, S)."""
        k = len(self.normalized_shape)
        if not (isinstance(x, Tensor) and x.is_floating_point() and x.dim() >= k
                and tuple(x.shape[x.dim() - k:]) == self.normalized_shape
                and (self.weight is None or (x.device == self.weight.device and (x.dtype == self.weight.dtype or (
                    x.dtype in _LOW_PRECISION and self.weight.dtype == torch.float32))))):
            self._reject_input(x)  # the cheap test above failed: find out what is wrong and say so
        if x.dtype not in _LOW_PRECISION:  # x (*, S) -> out (*, S), mean and invstd (*, 1...)
            out, mean, invstd = torch.native_layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
            self._cache = (x, mean, invstd, x.dtype)
            self._versions = versions(x, self.weight, self.bias)
            return out
        dims = tuple(range(x.dim() - k, x.dim()))  # the normalised axes
        sdtype = torch.float32  # statistics dtype
        xs = x.to(sdtype)
        # Two passes (mean, then the mean of squared deviations): numerically good, and on CPU several
        # times faster than torch.var_mean here (measured).
        xc = xs - xs.mean(dims, keepdim=True)  # (*, S) x - mean
        invstd = torch.rsqrt((xc * xc).mean(dims, keepdim=True) + self.eps)  # (*, 1...) 1/sqrt(biased var + eps)
        xhat = xc * invstd  # (*, S)
        self._cache = (xhat, None, invstd, x.dtype)
        self._versions = versions(xhat, self.weight, self.bias)
        return self._affine(xhat, x.dtype)

    def recompute(self) -> Tensor:
        """After a forward, before its backward: the forward's output again, bit for bit (the same kernel on the
        kept input), for a next layer that did not keep it (a Linear's ``keep_input=False``: the GPT's blocks)."""
        if self._cache is None:
            raise RuntimeError(f"{self!r}: recompute() needs a forward first (and is gone after backward)")
        x, mean, invstd, xdtype = self._cache
        check_versions(self, self._kept_names, (x, self.weight, self.bias), self._versions, before="recompute()")
        if mean is not None:
            return torch.native_layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)[0]
        return self._affine(x, xdtype)  # float16/bfloat16 input: x is the kept xhat, in float32

    def _affine(self, xhat: Tensor, dtype: torch.dtype) -> Tensor:
        """gamma * xhat + beta in xhat's (float32) dtype, then cast to ``dtype``: the half-precision forward's
        last step, and its recompute's."""
        out = xhat
        if self.weight is not None:
            w = self.weight.to(xhat.dtype)
            out = xhat * w if self.bias is None else torch.addcmul(self.bias.to(xhat.dtype), xhat, w)  # (*, S)
        return out if out.dtype == dtype else out.to(dtype)

    def backward(self, dout: Tensor) -> Tensor:
        """dout: (*, S) -> dx: (*, S); adds dgamma (S) and dbeta (S) into weight.grad and bias.grad."""
        cache = self._cache
        check_backward_dout(self, dout, *((cache[0].shape, cache[3], cache[0].device) if cache is not None
                                          else (None, None, None)))
        self._cache = None
        xhat, mean, invstd, xdtype = cache
        check_versions(self, self._kept_names, (xhat, self.weight, self.bias), self._versions)
        if mean is not None:  # xhat = (x - mean) * invstd, recomputed from the kept input
            xhat = torch.sub(xhat, mean).mul_(invstd)  # (*, S)
        k = len(self.normalized_shape)
        dims = tuple(range(xhat.dim() - k, xhat.dim()))
        lead = tuple(range(xhat.dim() - k))  # the axes gamma and beta are shared over
        d = dout if dout.dtype == xhat.dtype else dout.to(xhat.dtype)
        tmp = d * xhat  # (*, S)
        if self.weight is not None:
            w = self.weight.to(d.dtype)
            accumulate_grad(self.weight, tmp.sum(lead).to(self.weight.dtype))  # S
            if self.bias is not None:
                accumulate_grad(self.bias, d.sum(lead).to(self.bias.dtype))  # S
            tmp.mul_(w)  # (*, S) dxhat * xhat
            dx = d * w  # (*, S) dxhat, becomes dx in place below
        else:
            dx = d.clone()
        # dx = invstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), in dxhat's memory
        m2 = tmp.mean(dims, keepdim=True)  # (*, 1...)
        dx.sub_(dx.mean(dims, keepdim=True)).addcmul_(xhat, m2, value=-1).mul_(invstd)  # (*, S)
        return dx if dx.dtype == xdtype else dx.to(xdtype)

    # -- the backward split in two: B (the input gradient, now) and W (the weight gradient, later) ----------------
    # dgamma = sum of dout * xhat shares its product with dx's mean(dxhat * xhat) = mean(dout * xhat * gamma): B
    # computes xhat and dout * xhat once and keeps the product and dout for W, which is then only the two sums
    # over the leading axes.  The split stops there (splitting further would compute xhat and the product twice).

    @torch.no_grad()
    def backward_input(self, dout: Tensor) -> Tensor:
        """B: dout (*, S) -> dx (*, S), as ``backward`` returns it; nothing is written into .grad.  Keeps dout * xhat
        and dout (two (*, S) tensors) for ``backward_weight()``."""
        if getattr(self, "_pending_w", None) is not None:
            raise RuntimeError(f"{self!r}: backward_input() again before backward_weight() of the previous one")
        cache = self._cache
        check_backward_dout(self, dout, *((cache[0].shape, cache[3], cache[0].device) if cache is not None
                                          else (None, None, None)))
        self._cache = None
        xhat, mean, invstd, xdtype = cache
        check_versions(self, self._kept_names, (xhat, self.weight, self.bias), self._versions)
        if mean is not None:  # xhat = (x - mean) * invstd, recomputed from the kept input
            xhat = torch.sub(xhat, mean).mul_(invstd)  # (*, S)
        k = len(self.normalized_shape)
        dims = tuple(range(xhat.dim() - k, xhat.dim()))
        lead = tuple(range(xhat.dim() - k))
        d = dout if dout.dtype == xhat.dtype else dout.to(xhat.dtype)
        tmp = d * xhat  # (*, S) dout * xhat: dgamma's summand, kept for W
        if self.weight is not None:
            w = self.weight.to(d.dtype)
            self._pending_w = (tmp, d, lead)
            m2 = (tmp * w).mean(dims, keepdim=True)  # (*, 1...) mean(dxhat * xhat)
            dx = d * w  # (*, S) dxhat
        else:
            self._pending_w = (None, None, lead)
            m2 = tmp.mean(dims, keepdim=True)
            dx = d.clone()
        dx.sub_(dx.mean(dims, keepdim=True)).addcmul_(xhat, m2, value=-1).mul_(invstd)  # (*, S)
        return dx if dx.dtype == xdtype else dx.to(xdtype)

    @torch.no_grad()
    def backward_weight(self) -> None:
        """W: adds dgamma = sum of dout * xhat and dbeta = sum of dout (over the leading axes) into .grad, from the
        last ``backward_input``."""
        pending, self._pending_w = getattr(self, "_pending_w", None), None
        if pending is None:
            raise RuntimeError(f"{self!r}: backward_weight() needs a backward_input() before it (one W per B)")
        tmp, d, lead = pending
        if self.weight is not None and wants_grad(self.weight):
            accumulate_grad(self.weight, tmp.sum(lead).to(self.weight.dtype))  # S
        if self.bias is not None and wants_grad(self.bias):
            accumulate_grad(self.bias, d.sum(lead).to(self.bias.dtype))  # S

    def _reject_input(self, x: object) -> None:
        check_tensor(repr(self), "x", x)
        check_floating(repr(self), "x", x)
        k = len(self.normalized_shape)
        if x.dim() < k or tuple(x.shape[x.dim() - k:]) != self.normalized_shape:
            raise ValueError(f"{self!r}: expected input of shape (*, {', '.join(map(str, self.normalized_shape))}), "
                             f"got {tuple(x.shape)}")
        w = self.weight
        if x.device != w.device:
            raise ValueError(f"{self!r}: x is on {x.device} but the parameters are on {w.device}; "
                             f"move one of them (e.g. layer.to(device='{x.device}'))")
        raise ValueError(f"{self!r}: x has dtype {x.dtype} but the parameters have dtype {w.dtype} (a float16/"
                         f"bfloat16 input is accepted with float32 parameters); convert one of them")
