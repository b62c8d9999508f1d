"""What an optimizer's hyper-parameters must be: each checker refuses a bad value with a ValueError naming the
optimizer, the hyper-parameter and the value (a finite number in its range, a one-element tensor where torch.optim
takes one, a pair of betas, a True/False switch, torch.optim's implementation switches)."""

from __future__ import annotations

import math
import numbers
from typing import cast

import torch
from torch import Tensor

from layers.checks import is_a


def check_hyper(
    owner: str, name: str, value: object, *, lo: float = 0.0, hi: float | None = None, hi_open: bool = False
) -> float:
    """Refuse a hyper-parameter that is not a finite real number in [lo, hi] (or [lo, hi) with hi_open)."""
    if type(value) not in (float, int) and not is_a(value, numbers.Real):
        raise ValueError(f"{owner}: {name} must be a number, got {value!r}")  # (the usual types skip the ABC check)
    value = cast(float, value)  # a real number, as checked (an int, a numpy or symbolic float)
    # (finite as comparisons, not math.isfinite: torch.compile turns them into guards on a symbolic float)
    ok = (
        value == value
        and abs(value) != math.inf
        and value >= lo
        and (hi is None or (value < hi if hi_open else value <= hi))
    )
    if not ok:
        upper = "" if hi is None else f", {hi})" if hi_open else f", {hi}]"
        rng = f"finite and >= {lo}" if hi is None else f"in [{lo}{upper}"
        raise ValueError(f"{owner}: invalid {name} {value!r}: must be {rng}")
    return float(value)


def check_scalar_tensor(owner: str, name: str, value: object, *, read: bool = True, **bounds) -> float | Tensor:
    """A hyper-parameter that torch.optim also takes as a one-element tensor (lr, Adam's betas): a number is
    checked by ``check_hyper`` and returned as a float; a tensor must have one floating-point element, whose
    value is checked the same way (read once, here), and is returned as given (a scheduler fills it in place).
    ``read=False`` (the checks at step()): the value of a tensor on an accelerator is not read, nor any tensor's
    while torch.compile traces the step."""
    if not isinstance(value, Tensor):
        return check_hyper(owner, name, value, **bounds)
    if value.numel() != 1 or not value.is_floating_point() or value.requires_grad:
        raise ValueError(
            f"{owner}: a tensor {name} must hold one floating-point element and not require grad "
            f"(as torch.optim's), got shape {tuple(value.shape)}, dtype {value.dtype}, "
            f"requires_grad={value.requires_grad}"
        )
    if (read or value.device.type == "cpu") and not torch.compiler.is_compiling():  # (compiled: a graph never
        check_hyper(owner, name, value.item(), **bounds)  # reads back; the value was checked where it was given)
    return value


def check_betas(owner: str, betas: object, *, read: bool = True) -> tuple[float | Tensor, float | Tensor]:
    """Adam's (beta1, beta2), each in [0, 1): numbers as floats, tensors as 0-d tensors (as torch keeps them)."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{owner}: betas must be a pair (beta1, beta2), got {betas!r}")
    if isinstance(betas[0], Tensor) != isinstance(betas[1], Tensor):
        raise ValueError(f"{owner}: betas must be both numbers or both tensors, got {betas!r}")
    b1, b2 = (
        check_scalar_tensor(owner, "beta1 (betas[0])", betas[0], hi=1.0, hi_open=True, read=read),
        check_scalar_tensor(owner, "beta2 (betas[1])", betas[1], hi=1.0, hi_open=True, read=read),
    )
    return (b1.squeeze() if isinstance(b1, Tensor) else b1), (b2.squeeze() if isinstance(b2, Tensor) else b2)


def check_flag(owner: str, name: str, value: object) -> object:
    """A switch (maximize, amsgrad, ...): True or False (1 and 0 pass too), never a string that would read as True."""
    if not (isinstance(value, (bool, int)) and value in (0, 1)):
        raise ValueError(f"{owner}: {name} must be True or False, got {value!r}")
    return value


def check_impl_flags(
    owner: str, foreach: object, differentiable: object, fused: object, *, optimizer: str | None = None
) -> dict:
    """torch.optim's implementation switches, accepted with torch's meaning (see the module docstring); returns
    them for the param_groups (torch.optim keeps them there too).  ``optimizer``: the class name, where ``owner``
    is longer (a group's)."""
    optimizer = optimizer or owner
    if foreach not in (None, True, False):
        raise ValueError(f"{owner}: foreach must be None, True or False, got {foreach!r}")
    if differentiable is not False:
        raise ValueError(
            f"{owner}: differentiable={differentiable!r} is not supported: handgrad's update is written "
            f"by hand with in-place kernels outside autograd, so no gradient flows through a step; "
            f"use torch.optim.{optimizer} to differentiate through the optimizer"
        )
    if fused not in (None, False):
        raise ValueError(
            f"{owner}: fused={fused!r} is not supported: handgrad's update is its hand-written foreach "
            f"one (torch._foreach_* kernels), not a fused kernel; leave fused at None or False"
        )
    return {"foreach": foreach, "differentiable": False, "fused": fused}


# The checks a subclass's ``_hyper`` names: (owner, name, value, read) -> the value (lr and betas as the
# constructor keeps them; the others as given).
def learning_rate(owner: str, name: str, value: object, *, read: bool = True) -> float | Tensor:
    return check_scalar_tensor(owner, name, value, read=read)


def betas_pair(owner: str, name: str, value: object, *, read: bool = True) -> tuple:
    return check_betas(owner, value, read=read)


def non_negative(owner: str, name: str, value: object, *, read: bool = True) -> object:
    check_hyper(owner, name, value)
    return value


def decay_rate(owner: str, name: str, value: object, *, read: bool = True) -> object:
    check_hyper(owner, name, value, hi=1.0)
    return value
