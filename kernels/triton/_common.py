"""What every Triton kernel family here shares: the checks on its tensors, the accumulation dtype, block sizes a
GPU compiles, and one matrix product that the interpreter computes right in bfloat16.

Imported only by the family modules, which ``kernels.triton`` imports on first use: importing this file imports
Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MIN_DOT = 16  # every dimension of a tl.dot on an NVIDIA GPU (the interpreter accepts 1)

_TL = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32, torch.float64: tl.float64}


def interpreted(kernel) -> bool:
    """Whether ``kernel`` runs in Triton's interpreter (TRITON_INTERPRET=1 when its module was imported)."""
    return isinstance(kernel, InterpretedFunction)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Where sums and statistics are kept: float64 for float64 inputs, float32 for every other float."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def tl_dtype(dtype: torch.dtype):
    """The Triton dtype of a torch float dtype."""
    return _TL[dtype]


def pow2(n: int, least: int = 1) -> int:
    """The smallest power of two >= max(n, least): a block's width (tl.arange needs a power of two)."""
    return max(least, triton.next_power_of_2(max(int(n), 1)))


def check_block(owner: str, name: str, value: int, least: int = MIN_DOT) -> int:
    """A block size given by the caller: a power of two >= ``least`` (a tl.dot dimension needs 16 on a GPU)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least or value & (value - 1):
        raise ValueError(f"{owner}: {name} must be a power of two >= {least}, got {value!r}")
    return value


def check_tensors(owner: str, kernel, dtypes=FLOATS, **tensors: Tensor | None) -> torch.device:
    """Every named tensor (None: absent) a torch.Tensor on one device, of one of ``dtypes``; on CUDA unless
    ``kernel`` runs in the interpreter (which reads CPU tensors).  -> the device."""
    device = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{owner}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes:
            raise ValueError(f"{owner}: {name} must be one of {[str(d) for d in dtypes]}, got {t.dtype}")
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            raise ValueError(f"{owner}: {name} is on {t.device} but {first} is on {device}")
    if device is not None and device.type != "cuda" and not interpreted(kernel):
        raise ValueError(
            f"{owner}: a Triton kernel needs CUDA tensors, got tensors on {device} (on a CPU, "
            f"set TRITON_INTERPRET=1 before the first import of kernels.triton to run it in Triton's "
            f"interpreter)"
        )
    if device is None:
        raise ValueError(f"{owner}: no tensor given")
    return device


def upcast_dots(kernel, dtype: torch.dtype) -> bool:
    """Whether the kernel's bfloat16 products are computed in float32 (``dot`` below): only in the interpreter,
    which stores bfloat16 as uint16 and would multiply the bit patterns as integers."""
    return dtype == torch.bfloat16 and interpreted(kernel)


@triton.jit
def dot(a, b, acc, UPCAST: tl.constexpr):
    """acc + a @ b, accumulated in acc's dtype; float32 and float64 operands in full precision
    (input_precision="ieee": the GPU's default would round float32 to TF32, 10 bits of mantissa, which the
    interpreter does not emulate); float16 and bfloat16 on the tensor cores.  UPCAST (the interpreter's
    bfloat16): the operands as float32, whose products of bfloat16 values are exact as the tensor cores' are,
    so the result is the GPU's up to the order of the sums."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    if a.dtype == tl.float32 or a.dtype == tl.float64:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


def rows(t: Tensor) -> Tensor:
    """``t`` as a 2-D (rows, last dimension) tensor: a view with t's own strides where its leading dimensions
    merge into one (any layout whose leading axes are evenly spaced), a copy only where they do not."""
    if t.dim() == 0:
        return t.reshape(1, 1)
    return t.reshape(-1, t.shape[-1])
