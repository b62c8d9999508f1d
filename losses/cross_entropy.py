"""Softmax cross-entropy with a hand-written gradient: dL/dlogits = softmax - target distribution."""
from __future__ import annotations

import torch
from torch import Tensor

from layers.checks import capturing, check_floating, check_like, check_loss_dout, check_tensor
from layers.saved import check_versions, versions
from ._reduction import check_reduction

_LOW_PRECISION = (torch.float16, torch.bfloat16)  # computed in float32 (see CrossEntropyLoss)


def check_class_target(owner: str, logits: Tensor, target: Tensor, ignore_index: int | None = None) -> bool | None:
    """Class-index targets: integer (N,) on the logits' device, every class in [0, C) -- except those equal to
    ``ignore_index``, which may hold any value.  -> whether any target is ignored (None: not known, see below).

    The range check reads the smallest and largest class (and whether any is ignored) back to the host:
    one synchronisation per call.  While a CUDA graph is being captured that read is illegal, so the range
    check is skipped (dtype, shape and device are still checked) and None returned: a graph replays on new
    data without checking it, and an out-of-range class there gives a garbage loss (or a device-side
    assert), never an error naming the class.  ``training.cuda_graph.CapturedStep`` runs the step eagerly,
    checks included, first.  Under torch.compile the range check is an assertion in the graph
    (``torch._assert_async``): the compiled step raises where the eager one does, without naming the class.
    """
    n, c = logits.shape
    if target.device != logits.device:
        raise ValueError(f"{owner}: target is on {target.device} but logits are on {logits.device}")
    if target.is_floating_point() or target.dtype == torch.bool or target.is_complex() or target.shape != (n,):
        raise ValueError(f"{owner}: target must be integer class indices of shape ({n},), "
                         f"got {target.dtype} of shape {tuple(target.shape)}")
    if capturing(target) or n == 0:
        return None if n else False
    if torch.compiler.is_compiling():  # no read-back in a graph: the same check, as an assertion the graph runs
        kept = target if ignore_index is None else target.masked_fill(target == ignore_index, 0)
        torch._assert_async(((kept >= 0) & (kept < c)).all(),
                            f"{owner}: target contains a class outside [0, {c - 1}] for {c} classes"
                            + ("" if ignore_index is None else f" (ignore_index={ignore_index})"))
        return False if ignore_index is None else None
    if ignore_index is None:
        lo, hi = torch.stack(torch.aminmax(target)).tolist()  # one host sync for both bounds
        ignored = 0
    else:
        skip = target == ignore_index
        kept = target.masked_fill(skip, 0)  # ignored entries may be out of range (-100): check the others
        lo, hi, ignored = torch.stack([*torch.aminmax(kept), skip.any().to(kept.dtype)]).tolist()  # one sync
    if lo < 0 or hi >= c:
        raise ValueError(f"{owner}: target contains class {lo if lo < 0 else hi}, outside [0, {c - 1}] "
                         f"for {c} classes" + ("" if ignore_index is None else f" (ignore_index={ignore_index})"))
    return bool(ignored)


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

    logits: (N, C) floating point, or (N, C, d1, d2, ...) with a class score per position (as torch
    accepts them), or an unbatched (C,).  target: class indices (N,) / (N, d1, ...) / () of an integer
    dtype, or class probabilities of the logits' shape and dtype.  Matches ``torch.nn.CrossEntropyLoss``
    (reduction "mean" or "sum", label_smoothing, ignore_index).

    With log p = log_softmax(z) and q the target distribution after smoothing,
    q = (1 - eps) * target + eps / C:
        loss_n  = -sum_c q_nc log p_nc
        dL/dz_n = p_n * sum_c q_nc - q_n        (= softmax - q when q sums to 1)
    scaled by 1/N for "mean".  log_softmax subtracts the row maximum before
    exponentiating, so logits of magnitude 1e4 give finite, exact values; the
    softmax for the gradient is exp(log p), accurate to the last bits.

    ``ignore_index`` (class-index targets only, default -100 as torch): a position whose target equals it
    contributes neither loss nor gradient, and "mean" divides by the number of positions that are *not*
    ignored -- so a batch of padded sequences averages over real tokens.  Every target ignored: "mean" is
    0/0 = nan, as torch gives, and the gradient is zero.  Positions (N, C, d1, ...) are flattened to rows
    of an (N*d1*..., C) problem, the gradient comes back in the logits' shape.

    Mixed precision: float16/bfloat16 logits (and probability targets) are upcast to float32 first;
    log-softmax, the loss and the gradient are computed in float32 -- as torch.autocast runs
    cross_entropy -- the loss is returned in float32 and dL/dlogits is rounded once to the logits' dtype
    at the end (after ``dout``, e.g. a loss scale, has been applied).  float32/float64 are untouched.

    Kept from forward to backward: log p (its own) and the target (a view of the caller's, where no cast or
    copy was needed); changing the target in place in between is refused, as torch.autograd refuses it
    (layers/saved.py).
    """

    def __init__(self, reduction: str = "mean", label_smoothing: float = 0.0, ignore_index: int = -100):
        self.reduction = check_reduction("CrossEntropyLoss", reduction)
        if not 0.0 <= float(label_smoothing) <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], got {label_smoothing!r}")
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
            raise ValueError(f"CrossEntropyLoss: ignore_index must be an int, got {ignore_index!r}")
        self.label_smoothing = float(label_smoothing)
        self.ignore_index = ignore_index
        self._cache: tuple | None = None  # log p, target, scale, dlogits dtype, ignored mask, logits' shape

    def __repr__(self) -> str:
        ignore = f", ignore_index={self.ignore_index}" if self.ignore_index != -100 else ""
        return f"CrossEntropyLoss(reduction={self.reduction!r}, label_smoothing={self.label_smoothing}{ignore})"

    def __call__(self, logits: Tensor, target: Tensor) -> Tensor:
        return self.forward(logits, target)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """logits (N, C) / (N, C, d1, ...) / (C,), target of class indices or probabilities -> loss, a 0-d tensor."""
        shape = logits.shape if isinstance(logits, Tensor) else None
        logits, target = self._rows(logits, target)  # (M, C) and (M,) or (M, C)
        ignored = self._check(logits, target)
        n, c = logits.shape
        grad_dtype = logits.dtype
        if grad_dtype in _LOW_PRECISION:  # compute in float32, return dlogits in the logits' dtype
            logits = logits.float()
            target = target.float() if target.is_floating_point() else target
        eps = self.label_smoothing
        logp = torch.log_softmax(logits, 1)  # (M, C)
        skip = None
        if target.is_floating_point():
            scale = 1.0 / n if self.reduction == "mean" else 1.0
            q = target * (1 - eps) + eps / c if eps else target  # (M, C)
            total = (q * logp).sum()
        elif ignored is False:  # no target ignored (known): the plain sums
            scale = 1.0 / n if self.reduction == "mean" else 1.0
            target = target.long()  # uint8/int32 targets too (a uint8 index would otherwise act as a mask)
            total = (1 - eps) * logp.gather(1, target.unsqueeze(1)).sum()  # sum_n log p[n, y_n]
            if eps:
                total = total + eps / c * logp.sum()
        else:  # some targets ignored (or, while a CUDA graph is captured, perhaps): mask them out
            skip = target == self.ignore_index  # (M,)
            keep = (~skip).to(logp.dtype)  # (M,) 1 for a counted position
            target = target.long().masked_fill(skip, 0)  # any valid index: its terms are multiplied by 0
            total = (1 - eps) * (logp.gather(1, target.unsqueeze(1)).squeeze(1) * keep).sum()
            if eps:
                total = total + eps / c * (logp.sum(1) * keep).sum()
            scale = 1.0 / keep.sum() if self.reduction == "mean" else 1.0  # nan loss if every target is ignored
        self._cache = (logp, target, scale, grad_dtype, skip, shape)
        self._versions = versions(target)
        return total * -scale

    def backward(self, dout: float | Tensor = 1.0) -> Tensor:
        """-> dL/dlogits in the logits' shape, times ``dout`` (the upstream gradient of the scalar loss, default 1)."""
        if self._cache is None:
            raise RuntimeError(f"{self!r}: backward called before forward (or twice after one forward)")
        if not isinstance(dout, float):
            check_loss_dout(self, dout)
        logp, target, scale, grad_dtype, skip, shape = self._cache
        check_versions(self, ("target",), (target,), self._versions)
        self._cache = None
        eps, c = self.label_smoothing, logp.shape[1]
        s = dout * scale
        if target.is_floating_point():
            q = target * (1 - eps) + eps / c if eps else target
            grad = torch.exp(logp).mul_(q.sum(1, keepdim=True)).sub_(q).mul_(s)  # (p * sum(q) - q) * s
        else:
            grad = class_index_grad(logp, target, s, eps)
            if skip is not None:
                grad.masked_fill_(skip.unsqueeze(1), 0)  # an ignored position has no gradient
                if isinstance(scale, Tensor):
                    grad.nan_to_num_(0.0)  # every target ignored: 0 * (1/0) -- torch's gradient is zero there
        grad = grad if grad.dtype == grad_dtype else grad.to(grad_dtype)  # one rounding, after the scale
        return self._unrows(grad, shape)

    @staticmethod
    def _rows(logits: object, target: object) -> tuple:
        """(N, C, d1, ...) logits -> (N*d1*..., C) rows, class last (torch's layout keeps C second); (C,) -> (1, C).
        The target follows: (N, d1, ...) -> (N*d1*...,), probabilities like the logits.  Anything else is
        passed on unchanged for ``_check`` to judge."""
        if not (isinstance(logits, Tensor) and isinstance(target, Tensor)) or logits.dim() == 2:
            return logits, target
        if logits.dim() == 1:
            if target.dim() != (1 if target.is_floating_point() else 0):
                raise ValueError(f"CrossEntropyLoss: unbatched logits of shape {tuple(logits.shape)} need one class "
                                 f"index (a 0-d integer tensor) or probabilities of shape {tuple(logits.shape)}, "
                                 f"got {target.dtype} of shape {tuple(target.shape)}")
            return logits.unsqueeze(0), target.unsqueeze(0)
        if logits.dim() > 2:
            c = logits.shape[1]
            rows = logits.movedim(1, -1).reshape(-1, c)  # (M, C)
            if target.is_floating_point() and target.shape == logits.shape:
                return rows, target.movedim(1, -1).reshape(-1, c)
            if not target.is_floating_point() and target.shape == (logits.shape[0], *logits.shape[2:]):
                return rows, target.reshape(-1)
            raise ValueError(f"CrossEntropyLoss: logits of shape {tuple(logits.shape)} need class indices of shape "
                             f"{(logits.shape[0], *logits.shape[2:])} or probabilities of shape "
                             f"{tuple(logits.shape)}, got {target.dtype} of shape {tuple(target.shape)}")
        return logits, target

    @staticmethod
    def _unrows(grad: Tensor, shape: torch.Size) -> Tensor:
        """The inverse of ``_rows`` for the gradient: (M, C) -> the logits' shape."""
        if len(shape) == 2:
            return grad
        if len(shape) == 1:
            return grad.view(shape)
        return grad.view(shape[0], *shape[2:], shape[1]).movedim(-1, 1)  # (N, C, d1, ...)

    def _check(self, logits: Tensor, target: Tensor) -> bool | None:
        """-> whether any class-index target is ignored (None: not known while capturing; False for probabilities)."""
        owner = repr(self)
        check_tensor(owner, "logits", logits)
        check_tensor(owner, "target", target)
        check_floating(owner, "logits", logits)
        if logits.dim() != 2 or logits.shape[0] == 0:
            raise ValueError(f"{owner}: logits must have shape (N, C) with N >= 1 (or (N, C, d1, ...), or (C,)), "
                             f"got {tuple(logits.shape)}")
        n, c = logits.shape
        if target.is_floating_point() and target.device == logits.device:
            if target.shape != logits.shape:
                raise ValueError(f"{owner}: a floating-point target holds class probabilities and must have the "
                                 f"logits' shape {tuple(logits.shape)}, got {tuple(target.shape)} "
                                 f"(class indices must be an integer tensor of shape ({n},))")
            check_like(owner, "target", target, logits, "logits")
            return False
        return check_class_target(owner, logits, target, self.ignore_index)
