"""Softmax with cross-entropy: its gradient in place, rounded as autograd rounds it.

losses/cross_entropy.py writes the gradient as the exercise does, dlogits = (p - onehot(y)) / N: a copy of p, the
target's entry of each row less one, a division.  Here the same numbers on one buffer, in autograd's order of
operations (p times the scale first, then the one-hot part added), so that the result equals torch's cross_entropy
backward to the last bits:

    class_index_grad(logp, target, s, eps)   (p - (1 - eps) onehot - eps / C) * s        s = dout / N
    probability_grad(logp, q, s)             (p * sum(q) - q) * s
    cross_entropy_backward                   either, an ignored position's row zero; class indices with none
                                             ignored and a number s: the C++ kernel (kernels/cpp/softmax.cpp)
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import cpp


def class_index_grad(logp: Tensor, target: Tensor, s: float | Tensor, eps: float = 0.0) -> Tensor:
    """dL/dz for class-index targets, from log p = log_softmax(z): (p - (1 - eps) onehot - eps / C) * s.  A new
    (N, C) tensor."""
    grad = torch.exp(logp).mul_(s)  # (N, C) softmax * s
    onehot = torch.full((grad.shape[0], 1), 1.0, dtype=grad.dtype, device=grad.device).mul_((eps - 1) * s)  # (N, 1)
    grad.scatter_add_(1, target.long().unsqueeze(1), onehot)
    if eps:
        grad.sub_(eps / grad.shape[1] * s)
    return grad


def probability_grad(logp: Tensor, q: Tensor, s: float | Tensor) -> Tensor:
    """dL/dz for a target distribution q (N, C): (p * sum(q) - q) * s, in one buffer."""
    return torch.exp(logp).mul_(q.sum(1, keepdim=True)).sub_(q).mul_(s)


def cross_entropy_backward(
    logp: Tensor, target: Tensor, skip: Tensor | None, s: float | Tensor, eps: float = 0.0
) -> Tensor:
    """dL/dz (M, C) from log p (M, C), class indices (M,) or a distribution q (M, C), the ignored positions ``skip``
    (M,) or None, the scale ``s`` (dout / count for a mean) and the label smoothing ``eps``."""
    if target.is_floating_point():
        return probability_grad(logp, target, s)
    if skip is None and not isinstance(s, Tensor) and target.dtype == torch.long and cpp.usable(logp):
        # the same statement in one pass a row: kernels/cpp/softmax.cpp
        return cpp.ops.cross_entropy_backward(logp.contiguous(), target.contiguous(), float(s), float(eps))
    grad = class_index_grad(logp, target, s, eps)
    if skip is not None:
        grad.masked_fill_(skip.unsqueeze(1), 0)  # an ignored position has no gradient
        if isinstance(s, Tensor):
            grad.nan_to_num_(0.0)  # every target ignored: 0 * (1/0) -- torch's gradient is zero there
    return grad
