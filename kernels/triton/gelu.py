"""GELU, forward and backward, one Triton kernel each (both of layers.GELU's forms: "none" and "tanh").

The layer's formula (layers/activations.py), with Phi the standard normal CDF and phi its density:

    "none":  out = x Phi(x) = x/2 (1 + erf(x / sqrt 2))
             dx  = dout (Phi(x) + x phi(x)),                        phi(x) = exp(-x^2/2) / sqrt(2 pi)
    "tanh":  out = x/2 (1 + tanh(u)),                               u = sqrt(2/pi) (x + 0.044715 x^3)
             dx  = dout (1/2 (1 + tanh u) + x/2 (1 - tanh^2 u) u'),  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)

Triton has no tanh that its interpreter runs (libdevice's is an external call), so the "tanh" form is written
through the logistic function, with no loss: tanh(u) = 2 s - 1, s = 1 / (1 + exp(-2u)), so

    1/2 (1 + tanh u) = s,     1 - tanh^2 u = (1 - t)(1 + t) = 4 s (1 - s),
    out = x s,                dx = dout (s + 2 x s (1 - s) u').

That form is also the better rounded one: 1 + tanh(u) cancels for very negative x, s does not, and exp(-2u)
overflows to inf where s is 0, which is s's right value.  The GPT uses GELU's default, "none" (models/gpt.py);
GPT-2's own code used "tanh".

Each kernel reads the input (and dout) once and writes one tensor, in the input's dtype, computing in float32
(float64 for float64 input).  No state is kept: the backward takes x itself, as the layer keeps it.
Shape legend: x is (*, C); its leading axes are read as rows with their own strides (see _common.rows).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import acc_dtype, check_tensors, rows, tl_dtype

APPROXIMATIONS = ("none", "tanh")
INV_SQRT_2 = tl.constexpr(1.0 / math.sqrt(2.0))
INV_SQRT_2PI = tl.constexpr(1.0 / math.sqrt(2.0 * math.pi))
SQRT_2_OVER_PI = tl.constexpr(math.sqrt(2.0 / math.pi))
KAPPA = tl.constexpr(0.044715)


@triton.jit
def _gelu(x, TANH: tl.constexpr):
    """(out, dout/dx) of GELU at x, in x's dtype."""
    if TANH:
        u = SQRT_2_OVER_PI * (x + KAPPA * x * x * x)
        s = 1.0 / (1.0 + tl.exp(-2.0 * u))  # 1/2 (1 + tanh u)
        du = SQRT_2_OVER_PI * (1.0 + 3.0 * KAPPA * x * x)  # u'
        return x * s, s + 2.0 * x * s * (1.0 - s) * du
    cdf = 0.5 * (1.0 + tl.erf(x * INV_SQRT_2))  # Phi(x)
    pdf = tl.exp(-0.5 * x * x) * INV_SQRT_2PI  # phi(x)
    return x * cdf, cdf + x * pdf


@triton.jit
def _gelu_kernel(
    X,
    DOUT,
    OUT,
    R,
    C,
    sxr,
    sxc,
    sdr,
    sdc,
    sor,
    soc,
    BACKWARD: tl.constexpr,
    TANH: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """One (BLOCK_R, BLOCK_C) tile: OUT = gelu(X) (forward) or DOUT * gelu'(X) (backward)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = (r < R)[:, None] & (c < C)[None, :]
    r = r.to(tl.int64)[:, None]  # row offsets in 64 bits: rows * stride may pass 2^31
    c = c.to(tl.int64)[None, :]
    x = tl.load(X + r * sxr + c * sxc, mask=inside, other=0.0).to(ACC)
    out, slope = _gelu(x, TANH)
    if BACKWARD:
        dout = tl.load(DOUT + r * sdr + c * sdc, mask=inside, other=0.0).to(ACC)
        out = dout * slope
    tl.store(OUT + r * sor + c * soc, out.to(OUT.dtype.element_ty), mask=inside)


def _launch(owner: str, x: Tensor, dout: Tensor | None, approximate: str) -> Tensor:
    check_tensors(owner, _gelu_kernel, x=x, dout=dout)
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"{owner}: approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
    if dout is not None and (dout.shape != x.shape or dout.dtype != x.dtype):
        raise ValueError(
            f"{owner}: dout must have x's shape {tuple(x.shape)} and dtype {x.dtype}, got "
            f"{tuple(dout.shape)} {dout.dtype}"
        )
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # (*, C) contiguous
    if out.numel() == 0:
        return out
    x2, o2 = rows(x), rows(out)  # (R, C)
    d2 = rows(dout) if dout is not None else x2
    R, C = x2.shape
    block_c = min(triton.next_power_of_2(C), 1024)
    block_r = max(1, 2048 // block_c)  # about 2048 elements a program
    grid = (triton.cdiv(R, block_r), triton.cdiv(C, block_c))
    _gelu_kernel[grid](
        x2,
        d2,
        o2,
        R,
        C,
        *x2.stride(),
        *d2.stride(),
        *o2.stride(),
        BACKWARD=dout is not None,
        TANH=approximate == "tanh",
        ACC=tl_dtype(acc_dtype(x.dtype)),
        BLOCK_R=block_r,
        BLOCK_C=block_c,
    )
    return out


def gelu_forward(x: Tensor, *, approximate: str = "none") -> Tensor:
    """out = GELU(x), as F.gelu(x, approximate=approximate).

    Args:
        x: (*, C) float16, bfloat16, float32 or float64, any strides; CUDA (CPU under TRITON_INTERPRET=1).
        approximate: "none" (the erf form, layers.GELU's and the GPT's default) or "tanh".
    Returns:
        out: x's shape and dtype, contiguous.
    """
    return _launch("gelu_forward", x, None, approximate)


def gelu_backward(dout: Tensor, x: Tensor, *, approximate: str = "none") -> Tensor:
    """dx = dout * GELU'(x): the forward's input x is all the backward needs.

    Args:
        dout: (*, C) the upstream gradient, x's shape and dtype, any strides.
        x: (*, C) the forward's input.
        approximate: as in the forward.
    Returns:
        dx: x's shape and dtype, contiguous.
    """
    return _launch("gelu_backward", x, dout, approximate)
