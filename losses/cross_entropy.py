"""Softmax cross-entropy with a hand-written gradient: dL/dlogits = softmax - target distribution."""
from __future__ import annotations

import torch
from torch import Tensor

from layers._checks import check_floating, check_like, check_tensor
from ._reduction import check_reduction


class CrossEntropyLoss:
    """``loss = crit(logits, target)``; ``dlogits = crit.backward()``.

    logits: (N, C) floating point.  target: class indices (N,) of an integer
    dtype, or class probabilities (N, C) of the logits' dtype.  Matches
    ``torch.nn.CrossEntropyLoss`` (reduction "mean" or "sum", label_smoothing).

    With q the target distribution after smoothing, q = (1 - eps) * target + eps / C,
        loss_n = logsumexp(z_n) - sum_c q_nc z_nc        (stable for |z| ~ 1e4)
        dL/dz_n = softmax(z_n) * sum_c q_nc - q_n        (= softmax - q when q sums to 1)
    scaled by 1/N for "mean".
    """

    def __init__(self, reduction: str = "mean", label_smoothing: float = 0.0):
        self.reduction = check_reduction("CrossEntropyLoss", reduction)
        if not 0.0 <= float(label_smoothing) <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], got {label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)
        self._cache: tuple[Tensor, Tensor, float] | None = None

    def __repr__(self) -> str:
        return f"CrossEntropyLoss(reduction={self.reduction!r}, label_smoothing={self.label_smoothing})"

    def __call__(self, logits: Tensor, target: Tensor) -> Tensor:
        return self.forward(logits, target)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """logits (N, C), target (N,) int or (N, C) float -> loss, a 0-d tensor."""
        owner = repr(self)
        check_tensor(owner, "logits", logits)
        check_tensor(owner, "target", target)
        check_floating(owner, "logits", logits)
        if logits.dim() != 2 or logits.shape[0] == 0:
            raise ValueError(f"{owner}: logits must have shape (N, C) with N >= 1, got {tuple(logits.shape)}")
        n, c = logits.shape
        if target.device != logits.device:
            raise ValueError(f"{owner}: target is on {target.device} but logits are on {logits.device}")
        eps = self.label_smoothing
        # Stable softmax and log-sum-exp from one exp: shift by the row max so the largest term is exp(0) = 1.
        m = logits.amax(1, keepdim=True)  # (N, 1)
        e = torch.exp(logits - m)  # (N, C), in (0, 1]
        s = e.sum(1, keepdim=True)  # (N, 1), in [1, C]
        probs = e / s  # (N, C) softmax
        lse = (m + torch.log(s)).squeeze(1)  # (N,)
        if target.is_floating_point():
            if target.shape != logits.shape:
                raise ValueError(f"{owner}: a floating-point target holds class probabilities and must have the "
                                 f"logits' shape {tuple(logits.shape)}, got {tuple(target.shape)} "
                                 f"(class indices must be an integer tensor of shape ({n},))")
            check_like(owner, "target", target, logits, "logits")
            q = target * (1 - eps) + eps / c if eps else target  # (N, C)
            per_row = lse * q.sum(1) - (q * logits).sum(1)  # (N,)
            grad = probs * q.sum(1, keepdim=True) - q  # (N, C)
        else:
            if target.dtype == torch.bool or target.shape != (n,):
                raise ValueError(f"{owner}: class-index target must be an integer tensor of shape ({n},), "
                                 f"got {target.dtype} of shape {tuple(target.shape)}")
            lo, hi = torch.stack(torch.aminmax(target)).tolist()  # one host sync for both bounds
            if lo < 0 or hi >= c:
                bad = lo if lo < 0 else hi
                raise ValueError(f"{owner}: target contains class {bad}, outside [0, {c - 1}] for {c} classes")
            rows = torch.arange(n, device=logits.device)
            per_row = lse - (1 - eps) * logits[rows, target]  # (N,)
            grad = probs  # (N, C): probs is ours, modified in place
            if eps:
                per_row = per_row - eps / c * logits.sum(1)
                grad.sub_(eps / c)
            grad[rows, target] -= 1 - eps
        scale = 1.0 / n if self.reduction == "mean" else 1.0
        loss = per_row.sum() * scale
        self._cache = (grad, loss, scale)
        return loss

    def backward(self, dout: float | Tensor = 1.0) -> Tensor:
        """-> dL/dlogits (N, C), times ``dout`` (the upstream gradient of the scalar loss, default 1)."""
        if self._cache is None:
            raise RuntimeError(f"{self!r}: backward called before forward (or twice after one forward)")
        grad, _, scale = self._cache
        self._cache = None
        if isinstance(dout, Tensor) and dout.numel() != 1:
            raise ValueError(f"{self!r}: dout must be a scalar, got shape {tuple(dout.shape)}")
        return grad.mul_(dout * scale)
