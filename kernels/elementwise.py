"""Element-wise activations' backwards, arranged for speed: ReLU's mask as the sign of its output, GELU's in exp2.

Each is the formula of its layer's textbook backward (layers/activations.py) with the same numbers, written on as
few buffers as possible: a chain of in-place operations on one new tensor instead of a temporary per operation.
GELU's, for float32/float64 CPU tensors, is the C++ kernel of kernels/cpp/elementwise.cpp: the same formula in one
pass.

    relu_backward(dout, out)               dx = dout * (out > 0)                 as sign(out) * dout
    gelu_backward(x, out, dout, approx)    dx = dout * (Phi(x) + x phi(x))       Phi read off the output, phi in exp2
                                           dx = dout * (1/2 (1 + t) + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2))
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import compiled, cpp

LOG2E = 1.0 / math.log(2.0)  # e^y = 2^(y log2 e)
LOG2_INV_SQRT_2PI = -0.5 * math.log2(2.0 * math.pi)  # 2^this = 1 / sqrt(2 pi)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def relu_backward(dout: Tensor, out: Tensor) -> Tensor:
    """dx = dout * (out > 0).  out >= 0, so sign(out) is exactly the 0/1 mask, and multiplying by it is one float
    kernel where the boolean mask needs a temporary and a cast; the mask's buffer becomes dx (in place)."""
    return out.sign().mul_(dout)


def gelu_backward(x: Tensor, out: Tensor | None, dout: Tensor, approximate: str) -> Tensor:
    """GELU's dx, x the input and out the output ("none" reads Phi(x) off it), on one buffer (or one compiled
    pass where those kernels are on, kernels/compiled.py).

    "none":  Phi(x) = 1/2 + (out - x/2) / x, since out = x Phi(x) -- no erf, erfc or exp in backward (each slower
    than exp2 on the CPU, erfc and exp most where their results underflow: docs/benchmarks.md); not out / x: where x
    is subnormal, out = x Phi(x) ~ x/2 keeps too few digits to divide by x, while out - x/2 is then exactly 0 (both
    round x/2 alike), so Phi = 1/2, as it should; at x = 0 both are 0/0, set to 1/2.  phi(x) = 2^(-x^2/2 log2 e -
    log2 sqrt(2 pi)).  "tanh" computes t = tanh(sqrt(2/pi) (x + 0.044715 x^3)) again.  A float16/bfloat16 x is
    differentiated in float32 from a float32 output (a half-precision output keeps too few digits to read Phi off)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return gelu_backward(x.float(), None, dout.float(), approximate).to(x.dtype)
    if cpp.usable(x, dout) and dout.shape == x.shape:  # the same formulas in one pass: kernels/cpp/elementwise.cpp
        if approximate == "tanh":
            return cpp.ops.gelu_tanh_backward(x.contiguous(), dout.contiguous())
        if out is None:
            out = torch.nn.functional.gelu(x)
        return cpp.ops.gelu_backward(x.contiguous(), out.contiguous(), dout.contiguous())
    if out is None:
        out = torch.nn.functional.gelu(x, approximate=approximate)
    if compiled.usable(x, dout):
        dx = compiled.gelu_backward(x, out, dout, approximate)
        if dx is not None:
            return dx
    if approximate == "tanh":
        x2 = x * x  # (N, ...)
        t = torch.mul(x2, 0.044715).add_(1.0).mul_(x).mul_(SQRT_2_OVER_PI).tanh_()  # (N, ...) tanh(u)
        right = torch.mul(t, t).neg_().add_(1.0).mul_(x).mul_(0.5 * SQRT_2_OVER_PI)  # x/2 (1-t^2) sqrt(2/pi)
        right.mul_(x2.mul_(3 * 0.044715).add_(1.0))  # ... (1 + 3 * 0.044715 x^2)
        return right.add_(t.add_(1.0).mul_(0.5)).mul_(dout)  # (N, ...)
    g = torch.addcmul(x.new_full((), LOG2_INV_SQRT_2PI), x, x, value=-0.5 * LOG2E).exp2_()  # (N, ...) phi(x)
    g = torch.addcmul(x.new_full((), 0.5), g, x)  # 1/2 + x phi(x)
    g.addcdiv_(torch.add(out, x, alpha=-0.5), x)  # + (out - x/2) / x: Phi(x) + x phi(x), nan where x = 0 (0/0)
    # x = 0: Phi(0) + 0 = 1/2.  nan_to_num would also turn a nan in x into 1/2: adding 0 * x puts it back (0 * nan =
    # nan; 0 for any finite x).  Two in-place passes, where x == 0 and masked_fill_ need a boolean temporary.
    g.nan_to_num_(nan=0.5, posinf=math.inf, neginf=-math.inf).add_(x, alpha=0.0)
    return g.mul_(dout)
