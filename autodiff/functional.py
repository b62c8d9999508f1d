"""Functions of engine Tensors that are not methods: cross_entropy."""
from __future__ import annotations

import torch

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
    n, c = z.shape
    if t.is_floating_point() or t.dtype == torch.bool or t.shape != (n,):
        raise ValueError(f"cross_entropy: target must be integer class indices of shape ({n},), "
                         f"got {t.dtype} of shape {tuple(t.shape)}")
    lo, hi = torch.stack(torch.aminmax(t)).tolist()
    if lo < 0 or hi >= c:
        raise ValueError(f"cross_entropy: target contains class {lo if lo < 0 else hi}, outside [0, {c - 1}]")
    t = t.long().unsqueeze(1)  # (N, 1)
    scale = 1.0 / n if reduction == "mean" else 1.0
    logp = torch.log_softmax(z.data, 1)  # (N, C)
    loss = logp.gather(1, t).sum() * -scale

    def backward(g):
        s = g * scale
        grad = torch.exp(logp) * s  # (N, C) softmax, scaled
        grad.scatter_add_(1, t, (-s).expand(n, 1).to(grad.dtype))  # minus the one-hot target
        _accum(z, grad)
    return z._make(loss, (z,), "cross_entropy", backward)
