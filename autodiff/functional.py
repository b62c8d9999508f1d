"""Functions of engine Tensors that are not methods: cross_entropy."""

from __future__ import annotations

import torch

from kernels.softmax import class_index_grad
from losses.cross_entropy import check_class_target

from .engine import Tensor, _accum


def cross_entropy(logits: Tensor, target, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy of logits (N, C) against class indices (N,), as one graph node.

    loss = -sum_n log_softmax(z)[n, y_n] (/ N for "mean");  dL/dz = (softmax(z) - onehot(y)) (/ N)
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"cross_entropy: reduction must be 'mean' or 'sum', got {reduction!r}")
    z = logits if isinstance(logits, Tensor) else Tensor(logits)
    t = target.data if isinstance(target, Tensor) else torch.as_tensor(target, device=z.device)
    if z.data.dim() != 2 or z.shape[0] == 0:
        raise ValueError(f"cross_entropy: logits must have shape (N, C) with N >= 1, got {tuple(z.shape)}")
    check_class_target("cross_entropy", z.data, t)  # the checks and the gradient are CrossEntropyLoss's own
    n = z.shape[0]
    scale = 1.0 / n if reduction == "mean" else 1.0
    logp = torch.log_softmax(z.data, 1)  # (N, C)
    loss = logp.gather(1, t.long().unsqueeze(1)).sum() * -scale

    def backward(g):
        _accum(z, class_index_grad(logp, t, g * scale))  # softmax - onehot(target), scaled

    return z._make(loss, (z,), "cross_entropy", backward, (("its target", t),))  # logp is ours alone
