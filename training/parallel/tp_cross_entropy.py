"""Cross-entropy over logits split by vocabulary across ranks, without gathering them (Megatron's
``vocab_parallel_cross_entropy``), its gradient by hand; padded vocabulary columns kept out of the loss.

Shape legend: N = positions, Vl = this rank's columns of the padded vocabulary (Vp / T), V = the real vocabulary.
Rank r holds logits z[:, r*Vl:(r+1)*Vl].  Per row, with three all-reduces of one number each:

    m    = max over every rank's columns of z            (all-reduce MAX: exp stays in range)
    s    = sum over every rank's columns of exp(z - m)   (all-reduce SUM)
    z_y  = the target's logit, from the rank that holds it, 0 from the others   (all-reduce SUM)
    loss = mean over rows of (m + log s - z_y)

    dL/dz = (exp(z - m) / s - onehot(y)) / N, each rank its own columns; no communication.

A padded column (global index >= V) is -inf before the max: exp gives 0, so it is in no sum and its gradient is 0.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from layers.checks import BEFORE_FORWARD


class VocabParallelCrossEntropy:
    """``loss = crit(logits_local (N, Vl), target (N,))``, the mean over N; ``crit.backward(dloss=1.0)`` returns
    dlogits_local (N, Vl).

    ``start``: this rank's first column in the padded vocabulary; ``vocab_size``: V, the columns that count."""

    def __init__(self, start: int, vocab_size: int, group=None) -> None:
        self.start, self.vocab_size, self.group = start, vocab_size, group
        self._cache: tuple | None = None

    def __call__(self, logits: Tensor, target: Tensor) -> Tensor:
        return self.forward(logits, target)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        n, vl = logits.shape
        if target.shape != (n,) or target.is_floating_point():
            raise ValueError(
                f"VocabParallelCrossEntropy: target must be ({n},) integer classes, got "
                f"{target.dtype} of shape {tuple(target.shape)}"
            )
        cols = torch.arange(self.start, self.start + vl, device=logits.device)  # global column ids
        z = logits.masked_fill(cols >= self.vocab_size, -math.inf)  # (N, Vl) padded columns out
        m = z.amax(1)  # (N,)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=self.group)
        e = torch.exp(z - m.unsqueeze(1))  # (N, Vl)
        s = e.sum(1)  # (N,)
        dist.all_reduce(s, op=dist.ReduceOp.SUM, group=self.group)
        local = target - self.start
        mine = (local >= 0) & (local < vl)  # rows whose target this rank holds
        zy = torch.where(mine, z.gather(1, local.clamp(0, vl - 1).unsqueeze(1)).squeeze(1), 0.0)  # (N,)
        dist.all_reduce(zy, op=dist.ReduceOp.SUM, group=self.group)
        self._cache = (e, s, local, mine)
        return (m + s.log() - zy).mean()

    def backward(self, dloss: float | Tensor = 1.0) -> Tensor:
        if self._cache is None:
            raise RuntimeError(f"VocabParallelCrossEntropy: {BEFORE_FORWARD}")
        e, s, local, mine = self._cache
        self._cache = None
        n = e.shape[0]
        grad = e.div_(s.unsqueeze(1))  # (N, Vl) softmax, in exp's memory
        rows = torch.arange(n, device=e.device)[mine]
        grad[rows, local[mine]] -= 1.0  # - onehot(y), where the target is this rank's
        return grad.mul_(dloss / n)
