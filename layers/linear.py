"""Linear layer: out = x @ W + b, with a hand-written backward."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ._checks import check_dout, check_like, check_tensor
from .layer import accumulate_grad


class Linear:
    """Affine map ``out = x @ weight + bias``.

    ``weight`` has shape (D, H), so the forward reads ``x @ weight + bias`` and is
    a single ``addmm``.  In memory it is the transpose of an (H, D) row-major
    block -- nn.Linear's layout -- so every matrix product below is the very
    BLAS call that autograd makes for nn.Linear, with the same rounding (the
    forward output is bit-for-bit nn.Linear's, in float32 too).
    Initialised exactly as nn.Linear:
    Kaiming-uniform with a=sqrt(5), i.e. U(-1/sqrt(D), 1/sqrt(D)) for weight and
    bias, drawing from the global RNG in the same order, so under the same
    ``torch.manual_seed`` a Linear and an nn.Linear get identical weights.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Linear: {name} must be a positive int, got {v!r}")
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        w = torch.empty(out_features, in_features, device=device, dtype=dtype)  # (H, D), nn.Linear's layout
        w.uniform_(-bound, bound)
        self.weight = w.t()  # (D, H), strides (1, D): nn.Linear's memory layout
        self.bias = torch.empty(out_features, device=device, dtype=dtype).uniform_(-bound, bound) if bias else None
        self._x: Tensor | None = None  # cached input, needed for dW

    def __repr__(self) -> str:
        return f"Linear(in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None})"

    def __call__(self, x: Tensor) -> Tensor:
        return self.forward(x)

    def parameters(self) -> list[Tensor]:
        return [self.weight] if self.bias is None else [self.weight, self.bias]

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        return [("weight", self.weight)] + ([] if self.bias is None else [("bias", self.bias)])

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, D) -> out: (N, H)."""
        w = self.weight
        if not (isinstance(x, Tensor) and x.dim() == 2 and x.shape[1] == self.in_features
                and x.dtype == w.dtype and x.device == w.device):
            self._reject_input(x)  # the cheap test above failed: find out what is wrong and say so
        self._x = x
        if self.bias is None:
            return x @ self.weight  # (N, H)
        return torch.addmm(self.bias, x, self.weight)  # (N, H), bias add fused into the GEMM

    def backward(self, dout: Tensor, need_input_grad: bool = True) -> Tensor | None:
        """dout: (N, H) -> dx: (N, D); adds dW (D, H) and db (H,) into .grad.

        ``need_input_grad=False`` skips the dx product (the first layer of a net
        does not need it) and returns None.
        """
        x, w = self._x, self.weight
        if not (x is not None and isinstance(dout, Tensor) and dout.dim() == 2 and dout.shape[0] == x.shape[0]
                and dout.shape[1] == self.out_features and dout.dtype == w.dtype and dout.device == w.device):
            check_dout(repr(self), dout, None if x is None else torch.Size((x.shape[0], self.out_features)), w)
        self._x = None
        # dW = x^T @ dout, (D, H), computed as (dout^T @ x)^T so that it is laid out like the weight.
        if w.grad is None:
            w.grad = (dout.t() @ x).t()
        else:
            w.grad.t().addmm_(dout.t(), x)  # accumulated in place: no temporary
        if self.bias is not None:
            accumulate_grad(self.bias, dout.sum(0))  # (H,)
        return dout @ w.t() if need_input_grad else None  # (N, D)

    def _reject_input(self, x: object) -> None:
        check_tensor(repr(self), "x", x)
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"{self!r}: expected input of shape (N, {self.in_features}), got {tuple(x.shape)}")
        check_like(repr(self), "input", x, self.weight, "weight")

    def state_dict(self) -> dict[str, Tensor]:
        """nn.Linear's key names and layout: weight (H, D)."""
        sd = {"weight": self.weight.t()}
        if self.bias is not None:
            sd["bias"] = self.bias
        return sd

    def load_state_dict(self, sd: dict[str, Tensor], prefix: str = "") -> None:
        expected = {"weight": (self.out_features, self.in_features)}
        if self.bias is not None:
            expected["bias"] = (self.out_features,)
        for key, shape in expected.items():
            t = sd[key]
            if tuple(t.shape) != shape:
                raise ValueError(f"{self!r}: state_dict entry '{prefix}{key}' has shape {tuple(t.shape)}, "
                                 f"expected {shape} (nn.Linear layout, out_features x in_features)")
        with torch.no_grad():
            self.weight.copy_(sd["weight"].t())
            if self.bias is not None:
                self.bias.copy_(sd["bias"])
