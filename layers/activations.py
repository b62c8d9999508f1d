"""Parameter-free activations: ReLU, Tanh, Sigmoid, Softmax.

Each caches the one tensor its backward needs.  For tanh, sigmoid and softmax
that is the *output* (the derivative is a cheap function of it); ReLU's output
also tells where the input was positive, so nothing else is kept.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from .checks import check_dout, check_floating, check_tensor
from .layer import BaseLayer


class _Activation(BaseLayer, ABC):
    """Shared plumbing of the element-wise activations: validation and the cache of the output."""

    def __init__(self) -> None:
        self._out: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        """x: any shape -> out: same shape."""
        if not (isinstance(x, Tensor) and x.is_floating_point()):
            check_tensor(repr(self), "x", x)
            check_floating(repr(self), "x", x)
        self._out = out = self._forward(x)
        return out

    def backward(self, dout: Tensor) -> Tensor:
        """dout: shape of out -> dx: shape of x."""
        out = self._out
        if not (out is not None and isinstance(dout, Tensor) and dout.shape == out.shape
                and dout.dtype == out.dtype and dout.device == out.device):
            check_dout(repr(self), dout, None if out is None else out.shape, out)
        self._out = None
        return self._backward(dout, out)

    @abstractmethod
    def _forward(self, x: Tensor) -> Tensor:
        """The activation itself; its result is cached for ``_backward``."""

    @abstractmethod
    def _backward(self, dout: Tensor, out: Tensor) -> Tensor:
        """dL/dx from the upstream gradient and the cached output."""


class ReLU(_Activation):
    """out = max(x, 0);  dx = dout where out > 0, else 0 (the derivative at 0 is taken as 0, as torch does)."""

    torch_class = torch.nn.ReLU

    def _forward(self, x: Tensor) -> Tensor:
        return torch.relu(x)

    def _backward(self, dout: Tensor, out: Tensor) -> Tensor:
        # out >= 0, so sign(out) is exactly the 0/1 mask (out > 0).  Multiplying by it is one fused
        # float kernel; dout * (out > 0) computes the same numbers 3-5x slower on CPU (bool temporaries).
        return dout * out.sign()


class Tanh(_Activation):
    """out = tanh(x);  dx = dout * (1 - out^2)."""

    torch_class = torch.nn.Tanh

    def _forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x)

    def _backward(self, dout: Tensor, out: Tensor) -> Tensor:
        return dout * (1 - out * out)


class Sigmoid(_Activation):
    """out = 1 / (1 + exp(-x));  dx = dout * out * (1 - out)."""

    torch_class = torch.nn.Sigmoid

    def _forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(x)

    def _backward(self, dout: Tensor, out: Tensor) -> Tensor:
        return dout * out * (1 - out)


class Softmax(_Activation):
    """s = exp(x) / sum(exp(x), dim);  dx = s * (dout - sum(dout * s, dim)).

    The Jacobian ds_i/dx_j = s_i (delta_ij - s_j) is never formed: contracting
    it with dout gives the row-wise expression above, O(N*C) instead of O(N*C^2).
    """

    torch_class = torch.nn.Softmax
    _ctor_args = ("dim",)

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise ValueError(f"Softmax: dim must be an int, got {dim!r}")
        self.dim = dim

    def extra_repr(self) -> str:
        return f"dim={self.dim}"

    def _forward(self, x: Tensor) -> Tensor:
        if not -x.dim() <= self.dim < max(x.dim(), 1):
            raise ValueError(f"{self!r}: dim {self.dim} is out of range for an input of shape {tuple(x.shape)}")
        return torch.softmax(x, self.dim)  # subtracts the row max: stable for large logits

    def _backward(self, dout: Tensor, out: Tensor) -> Tensor:
        return out * (dout - (dout * out).sum(self.dim, keepdim=True))
