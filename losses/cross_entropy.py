"""Softmax cross-entropy with a hand-written gradient: dL/dlogits = softmax - target distribution."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

import kernels
from kernels import softmax
from layers.checks import (
    LOW_PRECISION,
    capturing,
    check_floating,
    check_int,
    check_like,
    check_probability,
    check_tensor,
)

from ._reduction import check_reduction
from .loss import Loss


def check_class_target(owner: str, logits: Tensor, target: Tensor, ignore_index: int | None = None) -> bool | None:
    """Class-index targets: integer (N,) on the logits' device, every class in [0, C) -- except those equal to
    ``ignore_index``, which may hold any value.  -> whether any target is ignored (None: not known, see below).

    The range check reads the smallest and largest class back to the host: one synchronisation per call
    (a second, for whether any target is ignored, only where ``ignore_index`` lies between them).  While a CUDA graph is
    being captured that read is illegal, so the range check is skipped (dtype, shape and device are still checked) and
    None returned: a graph replays on new data without checking it, and an out-of-range class there gives a garbage loss
    (or a device-side assert), never an error naming the class.  ``training.cuda_graph.CapturedStep`` runs the step
    eagerly, checks included, first.  Under torch.compile the range check is an assertion in the graph
    (``torch._assert_async``): the compiled step raises where the eager one does, without naming the class.
    """
    n, c = logits.shape
    if target.device != logits.device:
        raise ValueError(f"{owner}: target is on {target.device} but logits are on {logits.device}")
    if target.is_floating_point() or target.dtype == torch.bool or target.is_complex() or target.shape != (n,):
        raise ValueError(
            f"{owner}: target must be integer class indices of shape ({n},), "
            f"got {target.dtype} of shape {tuple(target.shape)}"
        )
    if capturing(target) or n == 0:
        return None if n else False
    if torch.compiler.is_compiling():  # no read-back in a graph: the same check, as an assertion the graph runs
        kept = target if ignore_index is None else target.masked_fill(target == ignore_index, 0)
        torch._assert_async(
            ((kept >= 0) & (kept < c)).all(),
            f"{owner}: target contains a class outside [0, {c - 1}] for {c} classes"
            + ("" if ignore_index is None else f" (ignore_index={ignore_index})"),
        )
        return False if ignore_index is None else None
    lo_t, hi_t = torch.aminmax(target)
    # the bounds read back: on the CPU each read is cheap, on a GPU one synchronisation for both
    lo, hi = (lo_t.item(), hi_t.item()) if target.device.type == "cpu" else torch.stack((lo_t, hi_t)).tolist()
    if ignore_index is None or not lo <= ignore_index <= hi:  # no target can equal ignore_index: none ignored
        ignored = 0
    else:  # some target may be ignored (and ignored ones may be out of range, -100): check the others
        skip = target == ignore_index
        kept = target.masked_fill(skip, 0)
        lo, hi, ignored = torch.stack([*torch.aminmax(kept), skip.any().to(kept.dtype)]).tolist()  # one sync
    if lo < 0 or hi >= c:
        raise ValueError(
            f"{owner}: target contains class {lo if lo < 0 else hi}, outside [0, {c - 1}] "
            f"for {c} classes" + ("" if ignore_index is None else f" (ignore_index={ignore_index})")
        )
    return bool(ignored)


class CrossEntropyLoss(Loss):
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

    Kept from forward to backward: log p (its own) and the target (a view of the caller's, where no cast,
    copy or smoothing was needed); changing the target in place in between is refused, as torch.autograd
    refuses it (layers/saved.py).  Written in the template (losses/loss.py).
    """

    class Saved(NamedTuple):
        logp: Tensor  # (M, C) log_softmax(z), M rows (positions), float32 for half-precision logits
        target: Tensor  # (M,) class indices (an ignored one set to 0), or (M, C) q, the smoothed distribution
        skip: Tensor | None  # (M,) True where the target is ignored; None: none is
        # the positions that count (M less the ignored ones; a tensor where it is known on the device only)
        count: int | Tensor  # type: ignore[assignment]  # (the field shadows tuple.count, which is not used)
        scale: float | Tensor  # 1/count for "mean", 1 for "sum"
        dtype: torch.dtype  # the logits', dlogits' (rounded once, after the scale)
        shape: torch.Size  # the logits'

    def __init__(self, reduction: str = "mean", label_smoothing: float = 0.0, ignore_index: int = -100):
        self.reduction = check_reduction("CrossEntropyLoss", reduction)
        self.label_smoothing = check_probability("CrossEntropyLoss", "label_smoothing", label_smoothing)
        self.ignore_index = check_int("CrossEntropyLoss", "ignore_index", ignore_index, lo=None)  # -100, -1, a class

    def __repr__(self) -> str:
        ignore = f", ignore_index={self.ignore_index}" if self.ignore_index != -100 else ""
        return f"CrossEntropyLoss(reduction={self.reduction!r}, label_smoothing={self.label_smoothing}{ignore})"

    def forward_math(self, logits: Tensor, target: Tensor):
        """logits (N, C) / (N, C, d1, ...) / (C,), target of class indices or probabilities -> loss, a 0-d tensor."""
        dtype, shape = logits.dtype, logits.shape
        z, t = _rows(logits, target)  # (M, C), and (M,) class indices or (M, C) probabilities
        probs = t.is_floating_point()
        # the range check reads back whether any target is ignored: which sums the loss needs
        ignored = False if probs else check_class_target(repr(self), z, t, self.ignore_index)
        if dtype in LOW_PRECISION:  # computed in float32; dlogits rounded to the logits' dtype at the end
            z, t = z.float(), (t.float() if probs else t)
        logp = torch.log_softmax(z, 1)  # (M, C)
        eps, (m, c) = self.label_smoothing, z.shape
        skip = keep = None
        if probs:
            t = t * (1 - eps) + eps / c if eps else t  # (M, C) q
            total = (t * logp).sum()  # sum_n sum_c q_nc log p_nc
        else:
            t = t.long()  # uint8/int32 targets too (a uint8 index would otherwise act as a mask)
            if ignored is not False:  # some targets ignored (or, while a CUDA graph is captured, perhaps)
                skip = t == self.ignore_index  # (M,)
                keep = (~skip).to(logp.dtype)  # (M,) 1 for a counted position
                t = t.masked_fill(skip, 0)  # any valid class: its terms are multiplied by 0
            total = (1 - eps) * _sum_rows(logp.gather(1, t.unsqueeze(1)), keep)  # sum_n log p[n, y_n]
            if eps:
                total = total + eps / c * _sum_rows(logp, keep)  # the uniform part: sum_n sum_c log p_nc
        count = m if keep is None else keep.sum()  # nan loss for "mean" if every target is ignored
        scale = 1.0 / count if self.reduction == "mean" else 1.0
        return total * -scale, self.Saved(logp, t, skip, count, scale, dtype, shape)

    def backward_math(self, dout: float | Tensor, saved: Saved) -> Tensor:
        """-> dL/dlogits in the logits' shape, times ``dout`` (the upstream gradient of the scalar loss, default 1)."""
        logp, target, skip = saved.logp, saved.target, saved.skip
        if kernels.enabled():  # in place, rounded as autograd rounds it: kernels/softmax.py
            grad = softmax.cross_entropy_backward(logp, target, skip, dout * saved.scale, self.label_smoothing)
            grad = grad if grad.dtype == saved.dtype else grad.to(saved.dtype)  # one rounding, after the scale
            return _unrows(grad, saved.shape)
        p = logp.exp()  # (M, C) softmax
        if target.is_floating_point():  # a distribution q: dL/dz = p * sum(q) - q (= p - q when q sums to 1)
            dlogits = p * target.sum(1, keepdim=True) - target
        else:
            n = len(target)
            dlogits = p.clone()  # (N, C)
            dlogits[torch.arange(n), target] -= 1  # p - onehot(target)
            if self.label_smoothing:  # q = (1 - eps) onehot + eps / C:  p - q = p - onehot + eps (onehot - 1/C)
                dlogits[torch.arange(n), target] += self.label_smoothing
                dlogits -= self.label_smoothing / dlogits.shape[1]
        if self.reduction == "mean":
            n = saved.count  # type: ignore[assignment]  # the positions that count (a tensor where known on the device)
            dlogits /= n  # the loss is a mean over the batch
        if skip is not None:
            dlogits[skip] = 0  # an ignored position has no gradient (every one ignored: 0, not 0/0)
        return _unrows((dlogits * dout).to(saved.dtype), saved.shape)

    def check_input(self, logits: object, target: object) -> None:
        """Types and shapes (the class range is checked in forward, where it is read back once)."""
        if (
            isinstance(logits, Tensor)
            and isinstance(target, Tensor)
            and logits.dim() == 2
            and logits.shape[0]
            and logits.is_floating_point()
            and not target.is_floating_point()
        ):
            return  # (N, C) and class indices: check_class_target, in forward, checks the rest
        owner = repr(self)  # the cheap test above failed, or probabilities: check all and say what is wrong
        logits = check_tensor(owner, "logits", logits)
        target = check_tensor(owner, "target", target)
        check_floating(owner, "logits", logits)
        probs, k = target.is_floating_point(), logits.dim()
        if k == 1 and target.dim() != (1 if probs else 0):
            raise ValueError(
                f"{owner}: unbatched logits of shape {tuple(logits.shape)} need one class "
                f"index (a 0-d integer tensor) or probabilities of shape {tuple(logits.shape)}, "
                f"got {target.dtype} of shape {tuple(target.shape)}"
            )
        classes = (logits.shape[0], *logits.shape[2:]) if k > 1 else ()  # a class index's shape
        if k > 2 and target.shape != (logits.shape if probs else classes):
            raise ValueError(
                f"{owner}: logits of shape {tuple(logits.shape)} need class indices of shape "
                f"{classes} or probabilities of shape {tuple(logits.shape)}, got {target.dtype} of "
                f"shape {tuple(target.shape)}"
            )
        if k == 0 or logits.shape[0] == 0 or 0 in classes:
            raise ValueError(
                f"{owner}: logits must have shape (N, C) with N >= 1 (or (N, C, d1, ...), or (C,)), "
                f"got {tuple(logits.shape)}"
            )
        if probs:
            if target.device != logits.device:
                raise ValueError(f"{owner}: target is on {target.device} but logits are on {logits.device}")
            if target.shape != logits.shape:
                raise ValueError(
                    f"{owner}: a floating-point target holds class probabilities and must have the "
                    f"logits' shape {tuple(logits.shape)}, got {tuple(target.shape)} "
                    f"(class indices must be an integer tensor of shape {classes})"
                )
            check_like(owner, "target", target, logits, "logits")


def _sum_rows(t: Tensor, keep: Tensor | None) -> Tensor:
    """The sum of ``t`` (M, ...) over its rows whose ``keep`` (M,) is 1; all rows where keep is None."""
    return t.sum() if keep is None else (t.sum(1) * keep).sum()


def _rows(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """(N, C, d1, ...) logits -> (N*d1*..., C) rows, class last (torch's layout keeps C second); (C,) -> (1, C).
    The target follows: (N, d1, ...) -> (N*d1*...,), probabilities like the logits."""
    if logits.dim() == 2:
        return logits, target
    if logits.dim() == 1:
        return logits.unsqueeze(0), target.unsqueeze(0)
    c = logits.shape[1]
    rows = logits.movedim(1, -1).reshape(-1, c)  # (M, C)
    return rows, (target.movedim(1, -1).reshape(-1, c) if target.is_floating_point() else target.reshape(-1))


def _unrows(grad: Tensor, shape: torch.Size) -> Tensor:
    """The inverse of ``_rows`` for the gradient: (M, C) -> the logits' shape."""
    if len(shape) == 2:
        return grad
    if len(shape) == 1:
        return grad.view(shape)
    return grad.view(shape[0], *shape[2:], shape[1]).movedim(-1, 1)  # (N, C, d1, ...)
