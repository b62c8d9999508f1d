"""Parameter-free activations: ReLU, Tanh, Sigmoid, Softmax, LogSoftmax, LeakyReLU, GELU, SiLU.

Each caches what its backward needs, and no more.  For tanh, sigmoid, softmax and
log-softmax that is the *output* (the derivative is a cheap function of it); ReLU's
output also tells where the input was positive.  GELU keeps its input, LeakyReLU
its input (or, in place, the mask of where it was positive), SiLU its output and
the sigmoid of its input.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from . import fused
from .fused import _LOG2_INV_SQRT_2PI, _LOG2E, _SQRT_2_OVER_PI  # the constants of GELU's formulas, once
from .checks import Expects, check_bool, check_int, check_number
from .layer import BaseLayer


class Out(NamedTuple):
    out: Tensor  # the activation's output: its derivative is a cheap function of it


class X(NamedTuple):
    x: Tensor  # the activation's input


class _Activation(BaseLayer):
    """An element-wise activation: any shape -> the same shape (the template's default input check)."""


class ReLU(_Activation):
    """out = max(x, 0);  dx = dout where out > 0, else 0 (the derivative at 0 is taken as 0, as torch does).
    ``inplace=True`` writes out into x, as nn.ReLU(inplace=True) does (the output is all the backward keeps)."""

    torch_class = torch.nn.ReLU
    _ctor_args = ("inplace",)

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = check_bool("ReLU", "inplace", inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""

    def forward_math(self, x: Tensor):
        out = torch.relu_(x) if self.inplace else torch.relu(x)
        return out, Out(out)

    def backward_math(self, dout: Tensor, saved: Out) -> Tensor:
        # out >= 0, so sign(out) is exactly the 0/1 mask (out > 0).  Multiplying by it is one fused
        # float kernel; dout * (out > 0) computes the same numbers 3-5x slower on CPU (bool temporaries),
        # torch.where(out > 0, dout, 0) 5-7x slower.  The mask's buffer becomes dx (mask * dout, in place):
        # one allocation of the activation's size, not two.
        return saved.out.sign().mul_(dout)


class Tanh(_Activation):
    """out = tanh(x);  dx = dout * (1 - out^2)."""

    torch_class = torch.nn.Tanh

    def forward_math(self, x: Tensor):
        out = torch.tanh(x)
        return out, Out(out)

    def backward_math(self, dout: Tensor, saved: Out) -> Tensor:
        return dout * (1 - saved.out * saved.out)


class Sigmoid(_Activation):
    """out = 1 / (1 + exp(-x));  dx = dout * out * (1 - out)."""

    torch_class = torch.nn.Sigmoid

    def forward_math(self, x: Tensor):
        out = torch.sigmoid(x)
        return out, Out(out)

    def backward_math(self, dout: Tensor, saved: Out) -> Tensor:
        return dout * saved.out * (1 - saved.out)


class _AlongDim(_Activation):
    """An activation normalised along one axis, ``dim`` (Softmax, LogSoftmax): its check and repr."""

    _ctor_args = ("dim",)
    expects = Expects(axis="dim")  # a floating-point tensor with an axis dim
    _dim_hint = ""  # added to the message that refuses a dim that is not an int

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = check_int(type(self).__name__, "dim", dim, lo=None, why=self._dim_hint)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax(_AlongDim):
    """s = exp(x) / sum(exp(x), dim);  dx = s * (dout - sum(dout * s, dim)).

    The Jacobian ds_i/dx_j = s_i (delta_ij - s_j) is never formed: contracting
    it with dout gives the row-wise expression above, O(N*C) instead of O(N*C^2).
    """

    torch_class = torch.nn.Softmax

    def __init__(self, dim: int = -1) -> None:
        super().__init__(dim)

    def forward_math(self, x: Tensor):
        out = torch.softmax(x, self.dim)  # subtracts the row max: stable for large logits
        return out, Out(out)

    def backward_math(self, dout: Tensor, saved: Out) -> Tensor:
        s = saved.out
        return s * (dout - (dout * s).sum(self.dim, keepdim=True))


class LogSoftmax(_AlongDim):
    """out = x - log(sum(exp(x), dim));  dx = dout - exp(out) * sum(dout, dim).

    d out_i / d x_j = delta_ij - softmax_j, so dx_j = dout_j - softmax_j * sum_i dout_i; softmax = exp(out).
    ``dim`` must be an int: torch's default dim=None picks a dimension from the input's rank (deprecated,
    with a warning) and is refused here, so a converted model never normalises over a guessed axis.
    """

    torch_class = torch.nn.LogSoftmax
    _dim_hint = (" (torch's implicit dim=None is not supported: say which axis holds the classes, e.g. "
                 "LogSoftmax(dim=1))")

    def __init__(self, dim: int | None = None) -> None:
        super().__init__(dim)

    def forward_math(self, x: Tensor):
        out = torch.log_softmax(x, self.dim)  # x - max - log(sum(exp(x - max))): stable
        return out, Out(out)

    def backward_math(self, dout: Tensor, saved: Out) -> Tensor:
        return dout - saved.out.exp() * dout.sum(self.dim, keepdim=True)


class LeakyReLU(_Activation):
    """out = x where x > 0, else negative_slope * x;  dx = dout where x > 0, else negative_slope * dout
    (at x = 0 the slope is negative_slope, as torch takes it).  Keeps x (or, with ``inplace=True``, the
    boolean mask x > 0, taken before x is overwritten)."""

    torch_class = torch.nn.LeakyReLU
    _ctor_args = ("negative_slope", "inplace")

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = check_number("LeakyReLU", "negative_slope", negative_slope)
        self.inplace = check_bool("LeakyReLU", "inplace", inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")

    def forward_math(self, x: Tensor):
        if self.inplace:  # keep the mask x > 0 (its own tensor, which nothing else can change): x is overwritten
            return torch.nn.functional.leaky_relu_(x, self.negative_slope), X(x > 0)
        return torch.nn.functional.leaky_relu(x, self.negative_slope), X(x)

    def backward_math(self, dout: Tensor, saved: X) -> Tensor:
        positive = saved.x if saved.x.dtype == torch.bool else saved.x > 0
        return torch.where(positive, dout, dout * self.negative_slope)




class GELU(_Activation):
    """out = x * Phi(x), Phi the standard normal CDF ("none"), or its tanh approximation ("tanh"):
    out = x/2 * (1 + tanh(u)),  u = sqrt(2/pi) * (x + 0.044715 x^3).

        "none":  dx = dout * (Phi(x) + x * phi(x)),   phi(x) = exp(-x^2/2) / sqrt(2 pi)
        "tanh":  dx = dout * (1/2 (1 + t) + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)),  t = tanh(u)

    Keeps x and out (out is held anyway: the next layer keeps it as its input).  "none" reads Phi(x) off the
    forward's result, Phi(x) = 1/2 + (out - x/2) / x, and phi as 2^(-x^2/2 log2 e - log2 sqrt(2 pi)): no erf,
    erfc or exp in backward (each slower than exp2 on the CPU, and erfc and exp many times slower where their
    results underflow; docs/benchmarks.md).  Not out / x: where x is subnormal, out = x Phi(x) ~ x/2 keeps too few
    digits to divide by x, while out - x/2 is then exactly 0 (both round x/2 alike), so Phi = 1/2, as it should;
    at x = 0 both are 0/0, set to 1/2.  "tanh" recomputes t.
    """

    torch_class = torch.nn.GELU
    _ctor_args = ("approximate",)

    class Saved(NamedTuple):
        x: Tensor
        out: Tensor

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"

    def forward_math(self, x: Tensor):
        out = torch.nn.functional.gelu(x, approximate=self.approximate)
        return out, self.Saved(x, out)

    def backward_math(self, dout: Tensor, saved: Saved) -> Tensor:
        x, out = saved
        if fused.usable(x, dout):  # the docstring's formula as one compiled pass (layers/fused.py), where on
            dx = fused.gelu_backward(x, out, dout, self.approximate)
            if dx is not None:
                return dx
        # In-place chains on as few buffers as possible: the same formulas as the docstring.
        if self.approximate == "tanh":
            x2 = x * x  # (N, ...)
            t = torch.mul(x2, 0.044715).add_(1.0).mul_(x).mul_(_SQRT_2_OVER_PI).tanh_()  # (N, ...) tanh(u)
            right = torch.mul(t, t).neg_().add_(1.0).mul_(x).mul_(0.5 * _SQRT_2_OVER_PI)  # x/2 (1-t^2) sqrt(2/pi)
            right.mul_(x2.mul_(3 * 0.044715).add_(1.0))  # ... (1 + 3 * 0.044715 x^2)
            return right.add_(t.add_(1.0).mul_(0.5)).mul_(dout)  # (N, ...)
        g = torch.addcmul(x.new_full((), _LOG2_INV_SQRT_2PI), x, x, value=-0.5 * _LOG2E).exp2_()  # (N, ...) phi(x)
        g = torch.addcmul(x.new_full((), 0.5), g, x)  # 1/2 + x phi(x)
        g.addcdiv_(torch.add(out, x, alpha=-0.5), x)  # + (out - x/2) / x: Phi(x) + x phi(x), nan where x = 0 (0/0)
        # x = 0: Phi(0) + 0 = 1/2.  nan_to_num would also turn a nan in x into 1/2: adding 0 * x puts it back
        # (0 * nan = nan; 0 for any finite x).  Two in-place passes, where x == 0 and masked_fill_ took ten times
        # as long (a boolean tensor; measured).
        g.nan_to_num_(nan=0.5, posinf=math.inf, neginf=-math.inf).add_(x, alpha=0.0)
        return g.mul_(dout)


class SiLU(_Activation):
    """out = x * s, s = sigmoid(x) (swish);  dx = dout * (s + out * (1 - s))   [= s (1 + x (1 - s))].

    Keeps s and out (not x), so ``inplace=True`` -- which overwrites x with out -- needs nothing else."""

    torch_class = torch.nn.SiLU
    _ctor_args = ("inplace",)
    _saved_labels = {"s": "sigmoid(x)"}

    class Saved(NamedTuple):
        s: Tensor  # sigmoid(x)
        out: Tensor

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = check_bool("SiLU", "inplace", inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""

    def forward_math(self, x: Tensor):
        s = torch.sigmoid(x)  # (N, ...)
        out = x.mul_(s) if self.inplace else x * s  # (N, ...)
        return out, self.Saved(s, out)

    def backward_math(self, dout: Tensor, saved: Saved) -> Tensor:
        s, out = saved
        return dout * (s + out * (1 - s))
