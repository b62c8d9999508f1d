"""Layer normalisation: each sample normalised over its last dimensions, with a hand-written backward.

Shape legend (see layers/layer.py): the input is (*, S), S = normalized_shape (one or more trailing
axes), * = any leading axes (N, or N and a sequence length, ...); K = prod(S) values per row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

import kernels
from kernels import norms

from .checks import LOW_PRECISION, Expects, check_bool, check_number, is_a
from .layer import BaseLayer, learned


class LayerNorm(BaseLayer):
    """out = gamma * xhat + beta,  xhat = (x - mean) / sqrt(var + eps), mean and biased var per row over S.

    Unlike batch norm, the statistics belong to one sample: the same in training and eval mode, no
    running estimates.  Backward, on rows of D = prod(S) values, rstd = 1 / sqrt(var + eps) and
    dxhat = dout * gamma (the batch-norm derivation with the roles of the axes swapped; see layers/batchnorm.py):
    x reaches xhat three ways -- directly (term 1), through the row's mean (term 2) and through its variance
    (term 3) --, so

        dx     = rstd / D * (D * dxhat - sum(dxhat) - xhat * sum(dxhat * xhat))      (sums over the row)
        dgamma = sum over the rows of dout * xhat,   dbeta = sum over the rows of dout

    (llm.c's ``layernorm_backward`` writes the same with the two row means ``dnorm_mean`` and ``dnorm_norm_mean``.)
    The forward is torch's fused ``native_layer_norm`` (one pass for the statistics, one for the output: a
    forward computation, so nothing of autograd's), which also returns mean and rstd per row; backward
    recomputes xhat = (x - mean) * rstd from them (llm.c keeps mean and rstd, not xhat).  Kept: the input x
    itself, mean and rstd (one per row), as torch's LayerNorm keeps them; x and weight must not change in place
    before backward (checked, layers/saved.py).  The kernel (kernels/norms.py) evaluates the same statement in
    place, in dxhat's memory.
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
        rstd: Tensor  # (*, 1...) 1 / sqrt(biased var + eps)
        xhat: Tensor | None  # (*, S) float32, kept for a half-precision x; None: recomputed from x, mean, rstd
        weight: Tensor | None  # (S,) gamma, read by dx
        bias: Tensor | None  # (S,) beta

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
        try:
            shape = tuple(shape)
        except TypeError:
            shape = ()  # not a sequence: refused below
        if not shape or any(not is_a(s, int) or s < 1 for s in shape):
            raise ValueError(
                f"LayerNorm: normalized_shape must be an int >= 1 or a non-empty sequence of them, "
                f"got {normalized_shape!r}"
            )
        check_bool("LayerNorm", "elementwise_affine", elementwise_affine)
        check_bool("LayerNorm", "bias", bias)
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"LayerNorm: dtype must be floating point, got {dtype}")
        self.normalized_shape = shape
        self.eps = check_number("LayerNorm", "eps", eps, 0.0)
        self.elementwise_affine = elementwise_affine
        kw: dict[str, Any] = {"device": device, "dtype": dtype if dtype is not None else torch.get_default_dtype()}
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
        if x.dtype not in LOW_PRECISION:  # out (*, S), mean and rstd (*, 1...) in one fused kernel
            out, mean, rstd = torch.native_layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
            return out, self.Saved(x, mean, rstd, None, self.weight, self.bias)
        # float16/bfloat16: statistics in float32, in two passes (mean, then the mean of squared deviations):
        # numerically good, and on the CPU faster than torch.var_mean here (docs/benchmarks.md)
        dims = self._row_axes(x)
        xs = x.float()  # (*, S)
        mean = xs.mean(dims, keepdim=True)  # (*, 1...)
        xc = xs - mean  # (*, S)
        rstd = torch.rsqrt((xc * xc).mean(dims, keepdim=True) + self.eps)  # (*, 1...)
        xhat = xc.mul_(rstd)  # (*, S) kept: recomputing it from a half-precision x costs more than it saves
        return self._affine(xhat, x.dtype), self.Saved(x, mean, rstd, xhat, self.weight, self.bias)

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
        """dout: (*, S) -> dx: (*, S), and dweight (S), dbias (S) summed over the leading axes."""
        x, weight, bias = saved.x, saved.weight, saved.bias
        if kernels.enabled():  # the same statement in place, or compiled into one pass: kernels/norms.py
            dx, dweight, dbias = norms.layer_norm_backward(
                dout,
                x,
                saved.mean,
                saved.rstd,
                saved.xhat,
                weight,
                bias,
                self._row_axes(x),
                needs_dx=self.needs_input_grad,
            )
            return dx, {"weight": dweight, "bias": dbias}
        # on rows: the D values of each row side by side, every leading position a row of the batch N
        xhat = saved.xhat if saved.xhat is not None else (x - saved.mean) * saved.rstd  # (*, S) (float32 for half)
        k = math.prod(self.normalized_shape)
        xhat, dout, rstd = xhat.reshape(-1, k), dout.reshape(-1, k).to(xhat.dtype), saved.rstd.reshape(-1, 1)
        weight = xhat.new_ones(k) if weight is None else weight.reshape(k).to(xhat.dtype)  # (D,) gamma
        d = dout.shape[1]
        dweight = (dout * xhat).sum(0)  # (D,): weight is shared by every row
        dbias = dout.sum(0)  # (D,)
        dxhat = dout * weight  # (N, D)
        dx = (
            rstd / d * (d * dxhat - dxhat.sum(1, keepdim=True) - xhat * (dxhat * xhat).sum(1, keepdim=True))
        )  # (N, D): terms 1, 2, 3
        return dx.view(x.shape).to(x.dtype), {"weight": _like(dweight, saved.weight), "bias": _like(dbias, bias)}


def _like(grad: Tensor, param: Tensor | None) -> Tensor | None:
    """A parameter gradient of rows (D,) in its parameter's shape and dtype; None for an absent parameter."""
    return None if param is None else grad.view(param.shape).to(param.dtype)
