"""Layer normalisation: each sample normalised over its last dimensions, with a hand-written backward.

Shape legend (see layers/layer.py): the input is (*, S), S = normalized_shape (one or more trailing
axes), * = any leading axes (N, or N and a sequence length, ...); K = prod(S) values per row.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from . import fused
from .checks import LOW_PRECISION, Expects, check_bool, check_number, is_a
from .layer import BaseLayer, learned


class LayerNorm(BaseLayer):
    """out = gamma * xhat + beta,  xhat = (x - mean) / sqrt(var + eps), mean and biased var per row over S.

    Unlike batch norm, the statistics belong to one sample: the same in training and eval mode, no
    running estimates.  Backward, per row, with the K values of a row and dxhat = gamma * dout
    (the batch-norm derivation with the roles of the axes swapped; see layers/batchnorm.py):

        dx     = invstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))      (means over the row)
        dgamma = sum over the leading axes of dout * xhat,   dbeta = sum over the leading axes of dout

    The forward is torch's fused ``native_layer_norm`` (one pass for the statistics, one for the output: a
    forward computation, so nothing of autograd's), which also returns mean and invstd per row; backward
    recomputes xhat = (x - mean) * invstd from them (llm.c keeps mean and rstd, not xhat).  Kept: the input x
    itself, mean and invstd (one per row), as torch's LayerNorm keeps them; x, weight and bias (which
    ``recompute()`` reads too) must not change in place before backward (checked, layers/saved.py).
    A float16/bfloat16 input with float32 parameters is accepted (statistics in float32, computed in two
    passes, xhat kept in float32), as torch does; without parameters (elementwise_affine=False) any floating
    input is.

    Written in the template (layers/template.py).  dgamma shares its product dout * xhat with dx, so the
    generic ``backward_input``/``backward_weight`` split computes both in B and W adds them.
    """

    _param_names = ("weight", "bias")
    expects = Expects(trailing="normalized_shape", like=("weight",), half=True, shape="(*, {_shape_text})")
    torch_class = torch.nn.LayerNorm
    _ctor_args = ("normalized_shape", "eps", "elementwise_affine", "bias")

    class Saved(NamedTuple):
        x: Tensor  # (*, S) the input
        mean: Tensor  # (*, 1...) per row, float32 for a half-precision x
        invstd: Tensor  # (*, 1...) 1 / sqrt(biased var + eps)
        xhat: Tensor | None  # (*, S) float32, kept for a half-precision x; None: recomputed from x, mean, invstd
        weight: Tensor | None  # (S,) gamma, read by dx
        bias: Tensor | None  # (S,) beta


    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
        try:
            shape = tuple(shape)
        except TypeError:
            shape = None
        if not shape or any(not is_a(s, int) or s < 1 for s in shape):
            raise ValueError(f"LayerNorm: normalized_shape must be an int >= 1 or a non-empty sequence of them, "
                             f"got {normalized_shape!r}")
        check_bool("LayerNorm", "elementwise_affine", elementwise_affine)
        check_bool("LayerNorm", "bias", bias)
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"LayerNorm: dtype must be floating point, got {dtype}")
        self.normalized_shape = shape
        self.eps = check_number("LayerNorm", "eps", eps, 0.0)
        self.elementwise_affine = elementwise_affine
        kw = {"device": device, "dtype": dtype if dtype is not None else torch.get_default_dtype()}
        self.weight = torch.ones(shape, **kw) if elementwise_affine else None  # S, gamma
        self.bias = torch.zeros(shape, **kw) if elementwise_affine and bias else None  # S, beta
        learned(self.weight, self.bias)

    @property
    def _shape_text(self) -> str:
        return ", ".join(map(str, self.normalized_shape))

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"

    def forward_math(self, x: Tensor):
        """x: (*, S) -> out: (*, S)."""
        if x.dtype not in LOW_PRECISION:  # out (*, S), mean and invstd (*, 1...) in one fused kernel
            out, mean, invstd = torch.native_layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
            return out, self.Saved(x, mean, invstd, None, self.weight, self.bias)
        # float16/bfloat16: statistics in float32, in two passes (mean, then the mean of squared deviations):
        # numerically good, and on CPU faster than torch.var_mean here (measured)
        dims = self._row_axes(x)
        xs = x.float()  # (*, S)
        mean = xs.mean(dims, keepdim=True)  # (*, 1...)
        xc = xs - mean  # (*, S)
        invstd = torch.rsqrt((xc * xc).mean(dims, keepdim=True) + self.eps)  # (*, 1...)
        xhat = xc.mul_(invstd)  # (*, S) kept: recomputing it from a half-precision x costs more than it saves
        return self._affine(xhat, x.dtype), self.Saved(x, mean, invstd, xhat, self.weight, self.bias)

    def _affine(self, xhat: Tensor, dtype: torch.dtype) -> Tensor:
        """gamma * xhat + beta in xhat's (float32) dtype, then cast to ``dtype``: the half-precision forward's
        last step."""
        out = xhat
        if self.weight is not None:
            w = self.weight.to(xhat.dtype)
            out = xhat * w if self.bias is None else torch.addcmul(self.bias.to(xhat.dtype), xhat, w)  # (*, S)
        return out if out.dtype == dtype else out.to(dtype)

    def _row_axes(self, x: Tensor) -> tuple[int, ...]:
        """The normalised axes S of an input (*, S): the last len(S)."""
        return tuple(range(x.dim() - len(self.normalized_shape), x.dim()))

    def backward_math(self, dout: Tensor, saved: Saved):
        """dout: (*, S) -> dx: (*, S), and dgamma (S), dbeta (S) summed over the leading axes."""
        x, mean, invstd, xhat, weight, bias = saved
        if xhat is None and weight is not None and self.needs_input_grad and fused.usable(dout, x, weight):
            k = weight.numel()  # the docstring's formulas as one compiled kernel (layers/fused.py), where on
            grads = fused.layer_norm_backward(dout.reshape(-1, k), x.reshape(-1, k), mean.reshape(-1, 1),
                                              invstd.reshape(-1, 1), weight.reshape(k))
            if grads is not None:
                dx, dweight, dbias = grads
                return dx.view(x.shape), {"weight": dweight.view(weight.shape),
                                          "bias": None if bias is None else dbias.view(bias.shape)}
        if xhat is None:
            xhat = torch.sub(x, mean).mul_(invstd)  # (*, S) recomputed from the kept input
        d = dout.to(xhat.dtype)  # (*, S)
        dims = self._row_axes(x)
        lead = tuple(range(x.dim() - len(dims)))  # the axes gamma and beta are shared over
        d_xhat = d * xhat  # (*, S)
        grads = {}
        if weight is not None:
            grads["weight"] = d_xhat.sum(lead).to(weight.dtype)  # (S,)
            grads["bias"] = None if bias is None else d.sum(lead).to(bias.dtype)  # (S,)
        if not self.needs_input_grad:
            return None, grads
        if weight is None:  # gamma = 1
            dxhat, dxhat_xhat = d.clone(), d_xhat  # (*, S) each
        else:
            w = weight.to(d.dtype)
            dxhat, dxhat_xhat = d * w, d_xhat.mul_(w)  # (*, S) each
        # dx = invstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), in dxhat's memory
        m2 = dxhat_xhat.mean(dims, keepdim=True)  # (*, 1...)
        dx = dxhat.sub_(dxhat.mean(dims, keepdim=True)).addcmul_(xhat, m2, value=-1).mul_(invstd)  # (*, S)
        return dx.to(x.dtype), grads
