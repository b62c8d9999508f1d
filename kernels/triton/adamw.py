"""AdamW, one Triton kernel over a flat parameter buffer (llm.c's ``adamw_kernel``): every element read once,
its parameter and both moments written once.

torch.optim.AdamW's update (Loshchilov & Hutter's decoupled decay), for step t = 1, 2, ... and each element:

    p = p * (1 - lr * wd)                                  decoupled weight decay
    m = m + (1 - beta1) (g - m)                            = beta1 m + (1 - beta1) g, torch's lerp
    v = beta2 v + (1 - beta2) g^2
    p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

in torch's order of operations (its foreach path: lerp, mul then addcmul, sqrt, divide by the bias
correction's square root, add eps, addcdiv), so float64 agrees to rounding and float32 to a few units in the
last place.  torch's lerp takes the other form, g - (g - m) beta1, for a weight 1 - beta1 >= 1/2; so does
this kernel.  The numbers that change from step to step (lr with a schedule, the bias corrections of t)
reach the kernel in a small device tensor of the parameters' dtype: a Python float argument would reach a
compiled kernel as float32, which a float64 update cannot afford (the interpreter would not show it), and a
constant of the kernel would compile it again at every new lr.

The flat buffer is what optimizers/flat.py views the parameters as when they tile one block (models.GPT
lays them out so), and llm.c's ``params_memory``; the four tensors are 1-D of one length and dtype (float32 or
float64), each with its own stride.  The update is in place and returns nothing.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import check_tensors

# the hyperparameters' places in the kernel's HYPER tensor
DECAY, W1, BETA2, W2, STEP_SIZE, BC2_SQRT, EPS = (tl.constexpr(i) for i in range(7))


@triton.jit
def _adamw_kernel(P, G, M, V, HYPER, n, sp, sg, sm, sv, F64: tl.constexpr, BLOCK: tl.constexpr):
    """BLOCK elements from program_id * BLOCK: the update above, in place on P, M and V."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    decay = tl.load(HYPER + DECAY)  # 1 - lr * wd  (scalars at fixed places of a 7-element tensor)
    w1 = tl.load(HYPER + W1)  # 1 - beta1, lerp's weight
    beta2 = tl.load(HYPER + BETA2)
    w2 = tl.load(HYPER + W2)  # 1 - beta2, from Python's float64: 1 - 0.999 in float32 is 1e-5 off
    step_size = tl.load(HYPER + STEP_SIZE)  # lr / (1 - beta1^t)
    bc2_sqrt = tl.load(HYPER + BC2_SQRT)  # sqrt(1 - beta2^t)
    eps = tl.load(HYPER + EPS)
    p = tl.load(P + i * sp, mask=inside, other=0.0)
    g = tl.load(G + i * sg, mask=inside, other=0.0)
    m = tl.load(M + i * sm, mask=inside, other=0.0)
    v = tl.load(V + i * sv, mask=inside, other=0.0)
    p = p * decay
    m = tl.where(w1 < 0.5, m + w1 * (g - m), g - (g - m) * (1.0 - w1))  # lerp(m, g, 1 - beta1), as torch's
    v = v * beta2 + w2 * g * g
    if F64:  # float64 square roots and quotients are IEEE on every backend
        denom = tl.sqrt(v) / bc2_sqrt + eps
        p = p - step_size * (m / denom)
    else:  # float32: the correctly rounded forms (the GPU's defaults are approximate), as torch's kernels compute
        denom = tl.math.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
        p = p - step_size * tl.math.div_rn(m, denom)
    tl.store(P + i * sp, p, mask=inside)
    tl.store(M + i * sm, m, mask=inside)
    tl.store(V + i * sv, v, mask=inside)


def adamw_step(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    *,
    step: int,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    block: int = 1024,
) -> None:
    """One AdamW step in place on ``param``, ``exp_avg`` and ``exp_avg_sq``, as torch.optim.AdamW's.

    Args:
        param, grad, exp_avg, exp_avg_sq: 1-D, one length and dtype (float32 or float64), any strides; CUDA
            (CPU under TRITON_INTERPRET=1).  The moments start at zero (torch.zeros_like(param)).
        step: t, the number of this step, 1 on the first (the caller counts, as torch.optim's state["step"]).
        lr, beta1, beta2, eps, weight_decay: torch.optim.AdamW's (betas=(beta1, beta2)).
        block: elements a program (a power of two).
    """
    owner = "adamw_step"
    device = check_tensors(
        owner,
        _adamw_kernel,
        (torch.float32, torch.float64),
        param=param,
        grad=grad,
        exp_avg=exp_avg,
        exp_avg_sq=exp_avg_sq,
    )
    for name, t in (("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if t.dtype != param.dtype or t.shape != param.shape:
            raise ValueError(
                f"{owner}: {name} must have param's shape {tuple(param.shape)} and dtype {param.dtype}, "
                f"got {tuple(t.shape)} {t.dtype}"
            )
    if param.dim() != 1:
        raise ValueError(
            f"{owner}: the buffers must be 1-D (a flat view of the parameters), got shape {tuple(param.shape)}"
        )
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise ValueError(f"{owner}: step must be an int >= 1 (the first step is 1), got {step!r}")
    for name, value, lo, hi in (
        ("lr", lr, 0.0, math.inf),
        ("beta1", beta1, 0.0, 1.0),
        ("beta2", beta2, 0.0, 1.0),
        ("eps", eps, 0.0, math.inf),
        ("weight_decay", weight_decay, 0.0, math.inf),
    ):
        if not isinstance(value, (int, float)) or not lo <= value < hi or (name.startswith("beta") and value >= 1):
            raise ValueError(f"{owner}: {name} must be a number in [{lo}, {hi}), got {value!r}")
    if not isinstance(block, int) or block < 16 or block & (block - 1):
        raise ValueError(f"{owner}: block must be a power of two >= 16, got {block!r}")
    bc1, bc2 = 1 - beta1**step, 1 - beta2**step  # torch's bias corrections, in Python's float64
    values = [0.0] * 7
    values[DECAY.value], values[W1.value], values[BETA2.value], values[W2.value] = (
        1 - lr * weight_decay,
        1 - beta1,
        beta2,
        1 - beta2,
    )
    values[STEP_SIZE.value], values[BC2_SQRT.value], values[EPS.value] = lr / bc1, bc2**0.5, eps
    hyper = torch.tensor(values, dtype=param.dtype, device=device)  # (7,) in the update's dtype
    n = param.numel()
    if n:
        _adamw_kernel[(triton.cdiv(n, block),)](
            param,
            grad,
            exp_avg,
            exp_avg_sq,
            hyper,
            n,
            param.stride(0),
            grad.stride(0),
            exp_avg.stride(0),
            exp_avg_sq.stride(0),
            F64=param.dtype == torch.float64,
            BLOCK=block,
        )
