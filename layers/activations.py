"""Parameter-free activations: ReLU, Tanh, Sigmoid, Softmax, LogSoftmax, LeakyReLU, GELU, SiLU.

Each is element-wise (softmax and log-softmax along one axis): its Jacobian is diagonal, so its backward is
dout times the local derivative, dx = dout * f'(x).  Each caches what that derivative needs, and no more.  For
tanh, sigmoid, softmax and log-softmax that is the *output* (the derivative is a cheap function of it); ReLU's
output also tells where the input was positive.  GELU keeps its input (and its output, for its kernel), LeakyReLU
its input (or, in place, the mask of where it was positive), SiLU its output and the sigmoid of its input.
ReLU's and GELU's backwards have faster forms in kernels/elementwise.py, used while the kernels are on.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

import kernels
from kernels import elementwise

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
        """dout -> dx: the gradient passes where the input was positive and stops elsewhere."""
        if kernels.enabled():  # the same numbers on one buffer: kernels/elementwise.py
            return elementwise.relu_backward(dout, saved.out)
        mask = saved.out > 0  # where x > 0: out = max(x, 0) is positive exactly there
        dx = dout * mask
        return dx


class Tanh(_Activation):
    """out = tanh(x);  dx = dout * (1 - out^2)."""

    torch_class = torch.nn.Tanh

    def forward_math(self, x: Tensor):
        out = torch.tanh(x)
        return out, Out(out)

    def backward_math(self, dout: Tensor, saved: Out) -> Tensor:
        out = saved.out
        dx = dout * (1 - out**2)
        return dx


class Sigmoid(_Activation):
    """out = 1 / (1 + exp(-x));  dx = dout * out * (1 - out)."""

    torch_class = torch.nn.Sigmoid

    def forward_math(self, x: Tensor):
        out = torch.sigmoid(x)
        return out, Out(out)

    def backward_math(self, dout: Tensor, saved: Out) -> Tensor:
        s = saved.out
        dx = dout * s * (1 - s)
        return dx


class _AlongDim(_Activation):
    """An activation normalised along one axis, ``dim`` (Softmax, LogSoftmax): its check and repr."""

    _ctor_args = ("dim",)
    expects = Expects(axis="dim")  # a floating-point tensor with an axis dim
    _dim_hint = ""  # added to the message that refuses a dim that is not an int

    def __init__(self, dim: int | None) -> None:  # None refused, with the hint
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
    _dim_hint = (
        " (torch's implicit dim=None is not supported: say which axis holds the classes, e.g. LogSoftmax(dim=1))"
    )

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

    the product rule on x Phi(x) and on x/2 (1 + t), with dt/du = 1 - t^2 (llm.c's ``gelu_backward``, whose
    ``sech_out`` 1 / cosh^2 is this 1 - t^2).  Keeps x, and the output for the kernel (kernels/elementwise.py reads
    Phi(x) off it, in exp2, without erf; the output is held anyway: the next layer keeps it as its input).
    """

    GELU_SCALING_FACTOR = math.sqrt(2.0 / math.pi)  # llm.c's name: sqrt(2/pi)

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
        if kernels.enabled():  # the same formulas on one buffer, in exp2: kernels/elementwise.py
            return elementwise.gelu_backward(saved.x, saved.out, dout, self.approximate)
        x = saved.x
        if self.approximate == "tanh":  # as llm.c's gelu_backward writes it
            cube = 0.044715 * x * x * x
            tanh_out = torch.tanh(self.GELU_SCALING_FACTOR * (x + cube))
            sech2 = 1.0 - tanh_out * tanh_out  # 1 / cosh^2, the derivative of tanh
            local_grad = 0.5 * (1.0 + tanh_out) + x * 0.5 * sech2 * self.GELU_SCALING_FACTOR * (
                1.0 + 3.0 * 0.044715 * x * x
            )
        else:
            cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))  # Phi(x)
            pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)  # phi(x)
            local_grad = cdf + x * pdf
        return local_grad * dout


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
