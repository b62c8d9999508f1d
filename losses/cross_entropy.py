"""Softmax cross-entropy with a hand-written gradient: dL/dlogits = softmax - target distribution."""
from __future__ import annotations

import torch
from torch import Tensor

from layers.checks import check_floating, check_like, check_tensor
from ._reduction import check_reduction

_LOW_PRECISION = (torch.float16, torch.bfloat16)  # computed in float32 (see CrossEntropyLoss)


def capturing(t: Tensor) -> bool:
    """True while ``t``'s CUDA stream is being captured into a graph, where reading a value back is illegal."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def check_class_target(owner: str, logits: Tensor, target: Tensor) -> None:
    """Class-index targets: integer (N,) on the logits' device, every class in [0, C).

    The range check reads the smallest and largest class back to the host: one synchronisation per
    call.  While a CUDA graph is being captured that read is illegal, so the range check is skipped
    (dtype, shape and device are still checked): a graph replays on new data without checking it, and
    an out-of-range class there gives a garbage loss (or a device-side assert), never an error naming
    the class.  ``training.cuda_graph.CapturedStep`` runs the step eagerly, checks included, first.
    """
    n, c = logits.shape
    if target.device != logits.device:
        raise ValueError(f"{owner}: target is on {target.device} but logits are on {logits.device}")
    if target.is_floating_point() or target.dtype == torch.bool or target.is_complex() or target.shape != (n,):
        raise ValueError(f"{owner}: target must be integer class indices of shape ({n},), "
                         f"got {target.dtype} of shape {tuple(target.shape)}")
    if capturing(target):
        return
    lo, hi = torch.stack(torch.aminmax(target)).tolist()  # one host sync for both bounds
    if lo < 0 or hi >= c:
        raise ValueError(f"{owner}: target contains class {lo if lo < 0 else hi}, outside [0, {c - 1}] "
                         f"for {c} classes")


def class_index_grad(logp: Tensor, target: Tensor, s: float | Tensor, eps: float = 0.0) -> Tensor:
    """dL/dz for class-index targets, from log p = log_softmax(z): (p - (1 - eps) onehot - eps / C) * s.

    Rounded as autograd rounds it (p * s first, then the one-hot part added), so the result equals
    torch's cross_entropy backward to the last bits.  A new (N, C) tensor.
    """
    grad = torch.exp(logp).mul_(s)  # (N, C) softmax * s
    onehot = torch.full((grad.shape[0], 1), 1.0, dtype=grad.dtype, device=grad.device).mul_((eps - 1) * s)  # (N, 1)
    grad.scatter_add_(1, target.long().unsqueeze(1), onehot)
    if eps:
        grad.sub_(eps / grad.shape[1] * s)
    return grad


class CrossEntropyLoss:
    """``loss = crit(logits, target)``; ``dlogits = crit.backward()``.

    logits: (N, C) floating point.  target: class indices (N,) of an integer
    dtype, or class probabilities (N, C) of the logits' dtype.  Matches
    ``torch.nn.CrossEntropyLoss`` (reduction "mean" or "sum", label_smoothing).

    With log p = log_softmax(z) and q the target distribution after smoothing,
    q = (1 - eps) * target + eps / C:
        loss_n  = -sum_c q_nc log p_nc
        dL/dz_n = p_n * sum_c q_nc - q_n        (= softmax - q when q sums to 1)
    scaled by 1/N for "mean".  log_softmax subtracts the row maximum before
    exponentiating, so logits of magnitude 1e4 give finite, exact values; the
    softmax for the gradient is exp(log p), accurate to the last bits.

    Mixed precision: float16/bfloat16 logits (and probability targets) are upcast to float32 first;
    log-softmax, the loss and the gradient are computed in float32 -- as torch.autocast runs
    cross_entropy -- the loss is returned in float32 and dL/dlogits is rounded once to the logits' dtype
    at the end (after ``dout``, e.g. a loss scale, has been applied).  float32/float64 are untouched.
    """

    def __init__(self, reduction: str = "mean", label_smoothing: float = 0.0):
        self.reduction = check_reduction("CrossEntropyLoss", reduction)
        if not 0.0 <= float(label_smoothing) <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], got {label_smoothing!r}")
        self.label_smoothing = float(label_smoothing)
        self._cache: tuple[Tensor, Tensor, float, torch.dtype] | None = None  # log p, target, scale, dlogits dtype

    def __repr__(self) -> str:
        return f"CrossEntropyLoss(reduction={self.reduction!r}, label_smoothing={self.label_smoothing})"

    def __call__(self, logits: Tensor, target: Tensor) -> Tensor:
        return self.forward(logits, target)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """logits (N, C), target (N,) int or (N, C) float -> loss, a 0-d tensor."""
        self._check(logits, target)
        n, c = logits.shape
        grad_dtype = logits.dtype
        if grad_dtype in _LOW_PRECISION:  # compute in float32, return dlogits in the logits' dtype
            logits = logits.float()
            target = target.float() if target.is_floating_point() else target
        eps = self.label_smoothing
        scale = 1.0 / n if self.reduction == "mean" else 1.0
        logp = torch.log_softmax(logits, 1)  # (N, C)
        if target.is_floating_point():
            q = target * (1 - eps) + eps / c if eps else target  # (N, C)
            total = (q * logp).sum()
        else:
            target = target.long()  # uint8/int32 targets too (a uint8 index would otherwise act as a mask)
            total = (1 - eps) * logp.gather(1, target.unsqueeze(1)).sum()  # sum_n log p[n, y_n]
            if eps:
                total = total + eps / c * logp.sum()
        self._cache = (logp, target, scale, grad_dtype)
        return total * -scale

    def backward(self, dout: float | Tensor = 1.0) -> Tensor:
        """-> dL/dlogits (N, C), times ``dout`` (the upstream gradient of the scalar loss, default 1)."""
        if self._cache is None:
            raise RuntimeError(f"{self!r}: backward called before forward (or twice after one forward)")
        if isinstance(dout, Tensor) and dout.numel() != 1:
            raise ValueError(f"{self!r}: dout must be a scalar, got shape {tuple(dout.shape)}")
        logp, target, scale, grad_dtype = self._cache
        self._cache = None
        eps, c = self.label_smoothing, logp.shape[1]
        s = dout * scale
        if target.is_floating_point():
            q = target * (1 - eps) + eps / c if eps else target
            grad = torch.exp(logp).mul_(q.sum(1, keepdim=True)).sub_(q).mul_(s)  # (p * sum(q) - q) * s
        else:
            grad = class_index_grad(logp, target, s, eps)
        return grad if grad.dtype == grad_dtype else grad.to(grad_dtype)  # one rounding, after the scale

    def _check(self, logits: Tensor, target: Tensor) -> None:
        owner = repr(self)
        check_tensor(owner, "logits", logits)
        check_tensor(owner, "target", target)
        check_floating(owner, "logits", logits)
        if logits.dim() != 2 or logits.shape[0] == 0:
            raise ValueError(f"{owner}: logits must have shape (N, C) with N >= 1, got {tuple(logits.shape)}")
        n, c = logits.shape
        if target.is_floating_point() and target.device == logits.device:
            if target.shape != logits.shape:
                raise ValueError(f"{owner}: a floating-point target holds class probabilities and must have the "
                                 f"logits' shape {tuple(logits.shape)}, got {tuple(target.shape)} "
                                 f"(class indices must be an integer tensor of shape ({n},))")
            check_like(owner, "target", target, logits, "logits")
            return
        check_class_target(owner, logits, target)
