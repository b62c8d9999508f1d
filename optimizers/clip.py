"""Gradient clipping by total norm and by value (same results as torch.nn.utils.clip_grad_*_)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from kernels.optimizers import flat_views


def _grads(parameters: Iterable[Tensor] | Tensor) -> list[Tensor]:
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def _number(name: str, value: Any) -> float:  # anything float() reads
    """A number, or a string float() reads ('inf', '2'), as torch's clip takes them; anything else refused."""
    try:
        return float(value)
    except (TypeError, ValueError):
        hint = (
            " (2.0 is the Euclidean norm, which 'fro' means for the gradients taken as one vector)"
            if name == "norm_type"
            else ""
        )
        raise ValueError(f"clip_grad_norm_: {name} must be a number{hint}, got {value!r}") from None


def clip_grad_norm_(
    parameters: Iterable[Tensor] | Tensor, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
) -> Tensor:
    """Scale all gradients in place so that their joint ``norm_type``-norm is at most ``max_norm``.

    total = ||(||g_1||, ..., ||g_k||)||   (the norm of all gradients as one vector)
    g_i  *= min(1, max_norm / (total + 1e-6))
    Returns ``total`` (before clipping) as a 0-d tensor on the gradients' device.

    Everything stays on the device: the norms, the clamped coefficient and the in-place scaling are
    kernels, nothing is read back and no CPU tensor is made, so clipping can run inside a captured CUDA
    graph and never stalls the GPU's queue.  The exception is ``error_if_nonfinite=True``, which must
    read the norm back to decide whether to raise (one synchronisation, as in torch).  Clipping always
    multiplies, by 1 when the norm is within bounds (no branch on the norm's value).
    """
    max_norm, norm_type = _number("max_norm", max_norm), _number("norm_type", norm_type)
    if max_norm < 0 or math.isnan(max_norm):
        raise ValueError(f"clip_grad_norm_: max_norm must be >= 0, got {max_norm}")
    if not norm_type > 0:  # torch also takes 0, negative orders and -inf, none of them a norm; refused here
        raise ValueError(
            f"clip_grad_norm_: norm_type must be > 0 or inf (2.0: the Euclidean norm, inf: the largest "
            f"|g|), got {norm_type}"
        )
    grads = _grads(parameters)
    if not grads:
        return torch.tensor(0.0)  # no gradient, so no device to put it on (torch returns the same)
    # Gradients that tile one block (kernels/optimizers.py) are scaled as one tensor below; their norm is still
    # taken tensor by tensor, as torch's clip does: one float32 sum over the whole block rounds differently,
    # and the coefficient carries that into every gradient (measured on the default GPT: the first step's
    # gradients 2e-5 apart from the twin's instead of 5e-7).
    scaled = flat_views(grads) or grads
    device = grads[0].device
    if math.isinf(norm_type):
        per_tensor: list[Tensor] | tuple[Tensor, ...] = [g.abs().max() for g in grads]
        total = torch.stack([n.to(device) for n in per_tensor]).max()
    else:
        per_tensor = torch._foreach_norm(grads, norm_type)
        # ||(n_1, ..., n_k)||_p = (sum_i n_i^p)^(1/p): the norm of the per-tensor norms.
        total = torch.linalg.vector_norm(torch.stack([n.to(device) for n in per_tensor]), norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(
            f"clip_grad_norm_: the total norm of order {norm_type} is non-finite ({total.item()}), "
            f"so the gradients cannot be clipped; pass error_if_nonfinite=False to clip anyway"
        )
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(scaled, coef.to(grads[0].dtype))
    return total


def clip_grad_value_(parameters: Iterable[Tensor] | Tensor, clip_value: float) -> None:
    """Clamp every gradient element into [-clip_value, clip_value] in place."""
    clip_value = float(clip_value)
    if clip_value < 0:
        raise ValueError(f"clip_grad_value_: clip_value must be >= 0, got {clip_value}")
    grads = _grads(parameters)
    if grads:
        torch._foreach_clamp_min_(grads, -clip_value)
        torch._foreach_clamp_max_(grads, clip_value)
