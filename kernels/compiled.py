"""Compiled kernels: a layer's own backward expression, compiled by Inductor into one pass, called from the eager step.

Eager torch runs an elementwise chain as one kernel per operation, each a pass over memory; autograd's backward
nodes for GELU and LayerNorm are single fused kernels (``gelu_backward``, ``native_layer_norm_backward``), so
the hand-written backward, which may not call them, pays several passes where they pay one.  Where eager torch
has no fused form of the math, Inductor can make one from the same math: each function below is the layer's
backward formula written plainly, and ``torch.compile`` turns it into a loop that reads each input once.

Opt-in, unlike the other kernels: the first call of each compiles it (seconds, and an import of torch's compiler),
so a process turns them on when its steps are many, e.g. a benchmark or a training run:

    from kernels import compiled
    compiled.enable()            # or: with compiled.kernels(): ...

The kernels (kernels/elementwise.py, kernels/norms.py) call one only where it is a drop-in for their eager math,
``usable(...)``: these compiled kernels on (and the kernels at all: ``kernels.enabled()``), CPU tensors of float32
or float64, nothing for autograd to record (the template's normal backward; gradcheck's autograd oracle records the
eager math instead), no dispatch mode active, and not while torch.compile traces a whole step (Inductor fuses the
eager math there itself, in the step's one graph).  Anything else -- and a kernel that fails to compile, said once in
a warning -- runs the eager kernel.  ``tests/test_kernels.py`` ties every kernel to its layer's textbook in float64
and float32.  Nothing here calls autograd or ``torch.ops.aten.*_backward``.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from . import enabled as kernels_on

_enabled = False
_compiled: dict[str, Callable | None] = {}  # name -> compiled kernel; None: it failed to compile, plain math used

_LOG2E = 1.0 / math.log(2.0)  # e^y = 2^(y log2 e)
_LOG2_INV_SQRT_2PI = -0.5 * math.log2(2.0 * math.pi)  # 2^this = 1 / sqrt(2 pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # (kernels/elementwise.py's constants: that module imports this one)
_DTYPES = (torch.float32, torch.float64)


def enable(on: bool = True) -> None:
    """Turn the compiled kernels on (or off) for this process."""
    global _enabled
    _enabled = bool(on)


def enabled() -> bool:
    """Whether the compiled kernels are on."""
    return _enabled


@contextlib.contextmanager
def kernels(on: bool = True) -> Iterator[None]:
    """Within: the compiled kernels on (or off), as before after."""
    before = _enabled
    enable(on)
    try:
        yield
    finally:
        enable(before)


def usable(*tensors: Tensor) -> bool:
    """Whether a kernel may run on ``tensors`` compiled instead of eagerly (the module docstring's rule)."""
    if not _enabled or not kernels_on() or torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return False  # (under a dispatch mode, e.g. a FLOP counter, torch.compile runs no compiled frame)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):  # autograd would record this
        return False
    dtype = tensors[0].dtype
    return all(t.device.type == "cpu" and t.dtype == dtype for t in tensors) and dtype in _DTYPES


# -- the math each kernel fuses ------------------------------------------------------------------------------


def gelu_backward_math(x: Tensor, out: Tensor, dout: Tensor) -> Tensor:
    """GELU ("none"): out = x Phi(x), so dx = dout * (Phi(x) + x phi(x)), Phi the standard normal CDF and phi its
    density; Phi read off the output as kernels/elementwise.py reads it, 1/2 + (out - x/2) / x (1/2 at x = 0),
    which needs no erf (slow in the generated code).  One pass: reads x, out and dout, writes dx."""
    pdf = torch.exp2(x * x * (-0.5 * _LOG2E) + _LOG2_INV_SQRT_2PI)  # phi(x), as the eager kernel computes it
    g = (0.5 + x * pdf) + (out - 0.5 * x) / x  # Phi(x) + x phi(x), in the eager kernel's order
    return dout * torch.where(x == 0, 0.5, g)


def gelu_tanh_backward_math(x: Tensor, dout: Tensor) -> Tensor:
    """GELU ("tanh"): out = x/2 (1 + t), t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), so
    dx = dout * (1/2 (1 + t) + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)).  One pass."""
    x2 = x * x
    t = torch.tanh(_SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x2))
    return dout * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x2))


def layer_norm_backward_math(
    dout: Tensor, x: Tensor, mean: Tensor, invstd: Tensor, weight: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm over the last axis, rows (N, K): dout, x (N, K), mean, invstd (N, 1), weight (K,) ->
    dx (N, K), dweight (K,), dbias (K,), with xhat = (x - mean) invstd recomputed in the loop and dxhat = dout w:

        dx = invstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)),  dweight = sum_n dout xhat,  dbias = sum_n dout

    A row pass (the two row means, then dx) and a column pass (the two sums over rows)."""
    xhat = (x - mean) * invstd
    dxhat = dout * weight
    m1 = dxhat.mean(-1, keepdim=True)
    m2 = (dxhat * xhat).mean(-1, keepdim=True)
    dx = invstd * (dxhat - m1 - xhat * m2)
    return dx, (dout * xhat).sum(0), dout.sum(0)


# -- calling them ------------------------------------------------------------------------------------------


def call(name: str, math_fn: Callable, *args):
    """``math_fn(*args)`` as its compiled kernel (compiled on first use; shapes are dynamic, so one kernel serves
    every batch size), or None where it failed to compile: the caller then runs its eager kernel."""
    if name not in _compiled:
        _compiled[name] = torch.compile(math_fn, dynamic=True, fullgraph=True)
    kernel = _compiled[name]
    if kernel is None:
        return None
    try:
        return kernel(*args)
    except Exception as e:  # a compiler missing or failing: say so once, and keep to the plain math
        _compiled[name] = None
        warnings.warn(
            f"handgrad: the compiled kernel {name} could not be compiled ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); the eager kernel runs instead",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def gelu_backward(x: Tensor, out: Tensor, dout: Tensor, approximate: str) -> Tensor | None:
    """GELU's dx in one pass (``out``: the forward's output, read by "none"), or None (the caller's eager kernel
    runs)."""
    if approximate == "tanh":
        return call("gelu_tanh_backward", gelu_tanh_backward_math, x, dout)
    return call("gelu_backward", gelu_backward_math, x, out, dout)


def layer_norm_backward(
    dout: Tensor, x: Tensor, mean: Tensor, invstd: Tensor, weight: Tensor
) -> tuple[Tensor, Tensor, Tensor] | None:
    """LayerNorm's (dx, dweight, dbias) for rows over the last K values, or None (the caller's eager kernel runs)."""
    return call("layer_norm_backward", layer_norm_backward_math, dout, x, mean, invstd, weight)
