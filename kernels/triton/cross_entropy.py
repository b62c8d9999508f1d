"""Softmax with cross-entropy, forward and backward, in Triton; and both in one kernel, as llm.c fuses its
classifier (``fused_classifier``: the loss and dlogits from one read of the logits' row).

The loss's formula (losses/cross_entropy.py), for a row of logits z (C classes) and its target class y, with
label smoothing eps spreading eps over the classes, q = (1 - eps) onehot(y) + eps / C:

    lse    = log sum_c exp(z_c)                       (the row's log-sum-exp; log p = z - lse)
    loss   = -sum_c q_c log p_c = lse - (1 - eps) z_y - eps/C sum_c z_c        (sum_c q_c = 1)
    dL/dz  = p - q = exp(z - lse) - q                 times s = dloss / N ("mean") or dloss ("sum")

so with eps = 0 the gradient is (softmax(z) - onehot(y)) / N, the textbook's.  A row whose target is
``ignore_index`` has no loss and no gradient, and "mean" divides by the rows that are not ignored (N above is
their count: torch's rule; every row ignored gives a nan loss and a zero gradient, as torch gives).

The forward reads the row in blocks of classes with an online softmax (a running maximum m and a running sum
l rescaled by exp(m_old - m_new) when the maximum grows), so a row of any width (GPT-2's 50257) is one pass;
it keeps lse, one number per row, for the backward, which recomputes p = exp(z - lse) block by block.  The
fused kernel, knowing s beforehand (dloss and the count of targets, device tensors: nothing is read back),
writes dL/dz in a second pass over the row right after its lse is known.

Computed in float32 (float64 for float64 logits), the gradient rounded once to the logits' dtype.  A target
outside [0, C) that is not ignore_index is refused before the kernel (one read-back, as the library's loss
makes); where that check is skipped, the row's loss and gradient are nan, never a read out of bounds.
Shape legend: N = rows (positions), C = classes.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import acc_dtype, check_block, check_tensors, pow2, tl_dtype

REDUCTIONS = ("mean", "sum", "none")
INTEGERS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@triton.jit
def _cross_entropy_kernel(
    Z,
    Y,
    LOSS,
    LSE,
    DZ,
    S,
    N,
    C,
    szr,
    szc,
    sy,
    sdr,
    sdc,
    ss,
    ignore_index,
    SMOOTHING: tl.constexpr,
    FORWARD: tl.constexpr,
    BACKWARD: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """One row.  FORWARD: its loss and lse (LOSS, LSE); BACKWARD: DZ = (p - q) * s, with lse from the
    forward just run, or (without FORWARD) loaded from LSE."""
    row = tl.program_id(0).to(tl.int64)
    is_row = row < N  # always: every load and store is masked all the same
    y = tl.load(Y + row * sy, mask=is_row, other=ignore_index).to(tl.int64)
    ignored = y == ignore_index
    valid = (y >= 0) & (y < C)
    z_row = Z + row * szr
    uniform = SMOOTHING / tl.cast(C, ACC)  # eps / C (C converted first: an int would make the quotient float32)
    if FORWARD:
        m = tl.full([], float("-inf"), ACC)  # running maximum
        l = tl.full([], 0.0, ACC)  # running sum of exp(z - m)
        z_y = tl.full([], 0.0, ACC)  # the target's logit
        z_sum = tl.full([], 0.0, ACC)  # sum of the logits (label smoothing's uniform part)
        for c0 in range(0, C, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            inside = (c < C) & is_row
            z = tl.load(z_row + c * szc, mask=inside, other=float("-inf")).to(ACC)
            m_new = tl.maximum(m, tl.max(z, axis=0))
            l = l * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)  # exp(-inf) = 0 past the row's end
            m = m_new
            z_y += tl.sum(tl.where(c == y, z, 0.0), axis=0)
            if SMOOTHING > 0:
                z_sum += tl.sum(tl.where(inside, z, 0.0), axis=0)
        lse = m + tl.log(l)
        loss = lse - (1.0 - SMOOTHING) * z_y
        if SMOOTHING > 0:
            loss -= uniform * z_sum
        loss = tl.where(ignored, 0.0, tl.where(valid, loss, float("nan")))
        tl.store(LOSS + row, loss, mask=is_row)
        tl.store(LSE + row, lse, mask=is_row)
    else:
        lse = tl.load(LSE + row, mask=is_row, other=0.0)
    if BACKWARD:
        s = tl.load(S + row * ss, mask=is_row, other=0.0).to(ACC)  # dloss (/ count for "mean")
        for c0 in range(0, C, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            inside = (c < C) & is_row
            z = tl.load(z_row + c * szc, mask=inside, other=0.0).to(ACC)
            q = (c == y).to(ACC) * (1.0 - SMOOTHING) + uniform  # (1 - eps) onehot + eps / C
            g = (tl.exp(z - lse) - q) * s
            g = tl.where(ignored, 0.0, tl.where(valid, g, float("nan")))
            tl.store(DZ + row * sdr + c * sdc, g.to(DZ.dtype.element_ty), mask=inside)


def _check(owner: str, logits: Tensor, target: Tensor, ignore_index: int, label_smoothing: float, reduction: str):
    check_tensors(owner, _cross_entropy_kernel, logits=logits)
    check_tensors(owner, _cross_entropy_kernel, INTEGERS, target=target)
    if target.device != logits.device:
        raise ValueError(f"{owner}: target is on {target.device} but logits are on {logits.device}")
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"{owner}: logits must be (N, C) with C >= 1, got shape {tuple(logits.shape)}")
    if target.shape != logits.shape[:1]:
        raise ValueError(
            f"{owner}: target must be (N,) = ({logits.shape[0]},) class indices, got shape {tuple(target.shape)}"
        )
    if reduction not in REDUCTIONS:
        raise ValueError(f"{owner}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not (isinstance(label_smoothing, (int, float)) and 0.0 <= label_smoothing <= 1.0):
        raise ValueError(f"{owner}: label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise ValueError(f"{owner}: ignore_index must be an int, got {ignore_index!r}")


def _check_targets(owner: str, target: Tensor, classes: int, ignore_index: int) -> None:
    """Refuse a class index outside [0, C) that is not ignore_index (one read-back)."""
    bad = ((target < 0) | (target >= classes)) & (target != ignore_index)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{owner}: target[{i}] = {int(target[i])} is not a class index in [0, {classes}) nor "
            f"ignore_index ({ignore_index})"
        )


def _scale(dloss: float | Tensor, target: Tensor, ignore_index: int, reduction: str, acc: torch.dtype) -> Tensor:
    """s per row as a device tensor, (N,) for "none", else 0-d: dloss / count ("mean") or dloss ("sum")."""
    s = torch.as_tensor(dloss, dtype=acc, device=target.device)
    if reduction == "mean":
        s = s / (target != ignore_index).sum().to(acc)  # 1/0 = inf when every row is ignored: torch's nan loss
    return s


def _run(owner, logits, target, lse, s, ignore_index, label_smoothing, forward, backward, block_c):
    N, C = logits.shape
    acc = acc_dtype(logits.dtype)
    loss = torch.empty(N, dtype=acc, device=logits.device) if forward else None  # (N,)
    lse = torch.empty(N, dtype=acc, device=logits.device) if forward else lse  # (N,)
    dz = torch.empty((N, C), dtype=logits.dtype, device=logits.device) if backward else None
    block_c = (
        min(pow2(C), 4096 if acc == torch.float32 else 2048)
        if block_c is None
        else check_block(owner, "block_c", block_c, least=1)
    )
    if N:
        s_arg = s if backward else lse
        ss = (s.stride(0) if s.dim() else 0) if backward else 0
        d_arg = dz if backward else logits
        _cross_entropy_kernel[(N,)](
            logits,
            target,
            loss if forward else lse,
            lse,
            d_arg,
            s_arg,
            N,
            C,
            *logits.stride(),
            target.stride(0),
            *d_arg.stride(),
            ss,
            ignore_index,
            SMOOTHING=float(label_smoothing),
            FORWARD=forward,
            BACKWARD=backward,
            ACC=tl_dtype(acc),
            BLOCK_C=block_c,
            num_warps=8 if block_c >= 2048 else 4,
        )
    return loss, lse, dz


def _reduce(losses: Tensor, target: Tensor, ignore_index: int, reduction: str) -> Tensor:
    if reduction == "none":
        return losses
    total = losses.sum()
    return total / (target != ignore_index).sum().to(total.dtype) if reduction == "mean" else total


def cross_entropy_forward(
    logits: Tensor,
    target: Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    check_targets: bool = True,
    block_c: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The loss of F.cross_entropy(logits, target, ...) for class-index targets, and each row's log-sum-exp.

    Args:
        logits: (N, C) float16, bfloat16, float32 or float64, any strides; CUDA (CPU under TRITON_INTERPRET=1).
        target: (N,) class indices (an integer dtype), any stride; ``ignore_index`` marks rows without a loss.
        label_smoothing: eps of q = (1 - eps) onehot + eps / C (a constant of the kernel).
        reduction: "mean" (over rows not ignored), "sum", or "none" (the (N,) losses, 0 where ignored).
        check_targets: refuse targets outside [0, C) (reads one flag back; False: such rows give nan).
        block_c: classes a block (a power of two); default up to 4096.
    Returns:
        loss: 0-d ((N,) for "none"), float32 (float64 for float64 logits).
        lse: (N,) log-sum-exp of each row, what cross_entropy_backward needs.
    """
    owner = "cross_entropy_forward"
    _check(owner, logits, target, ignore_index, label_smoothing, reduction)
    if check_targets:
        _check_targets(owner, target, logits.shape[1], ignore_index)
    losses, lse, _ = _run(owner, logits, target, None, None, ignore_index, label_smoothing, True, False, block_c)
    return _reduce(losses, target, ignore_index, reduction), lse


def cross_entropy_backward(
    dloss: float | Tensor,
    logits: Tensor,
    target: Tensor,
    lse: Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    block_c: int | None = None,
) -> Tensor:
    """dlogits = (softmax(logits) - q) * dloss / count ("mean"; * dloss for "sum"; * dloss[n] per row for "none").

    Args:
        dloss: the upstream gradient of the loss: a number or 0-d tensor ((N,) for "none").
        logits, target: the forward's; lse: (N,) from cross_entropy_forward.
        ignore_index, label_smoothing, reduction: as in the forward.
    Returns:
        dlogits: (N, C) in the logits' dtype, contiguous.
    """
    owner = "cross_entropy_backward"
    _check(owner, logits, target, ignore_index, label_smoothing, reduction)
    acc = acc_dtype(logits.dtype)
    check_tensors(owner, _cross_entropy_kernel, (acc,), lse=lse)
    if lse.shape != logits.shape[:1] or lse.device != logits.device:
        raise ValueError(
            f"{owner}: lse must be cross_entropy_forward's (N,) = ({logits.shape[0]},) on "
            f"{logits.device}, got {tuple(lse.shape)} on {lse.device}"
        )
    s = _scale_checked(owner, dloss, logits, target, ignore_index, reduction, acc)
    return _run(owner, logits, target, lse, s, ignore_index, label_smoothing, False, True, block_c)[2]


def cross_entropy_forward_backward(
    logits: Tensor,
    target: Tensor,
    *,
    dloss: float | Tensor = 1.0,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    check_targets: bool = True,
    block_c: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """llm.c's fused classifier: the forward's (loss, lse) and the backward's dlogits from one kernel, for a
    dloss known before the forward (1 for a plain training step).  Arguments as in the two functions above.
    Returns: (loss, lse, dlogits)."""
    owner = "cross_entropy_forward_backward"
    _check(owner, logits, target, ignore_index, label_smoothing, reduction)
    if check_targets:
        _check_targets(owner, target, logits.shape[1], ignore_index)
    acc = acc_dtype(logits.dtype)
    s = _scale_checked(owner, dloss, logits, target, ignore_index, reduction, acc)
    losses, lse, dz = _run(owner, logits, target, None, s, ignore_index, label_smoothing, True, True, block_c)
    return _reduce(losses, target, ignore_index, reduction), lse, dz


def _scale_checked(owner, dloss, logits, target, ignore_index, reduction, acc) -> Tensor:
    shape = logits.shape[:1] if reduction == "none" else ()
    if isinstance(dloss, Tensor):
        if tuple(dloss.shape) != tuple(shape) or dloss.device != logits.device:
            raise ValueError(
                f"{owner}: dloss must have shape {tuple(shape)} on {logits.device} for reduction "
                f"{reduction!r}, got {tuple(dloss.shape)} on {dloss.device}"
            )
    elif reduction == "none" or not isinstance(dloss, (int, float)) or not math.isfinite(dloss):
        raise ValueError(
            f"{owner}: dloss must be a finite number or a tensor of shape {tuple(shape)} for "
            f"reduction {reduction!r}, got {dloss!r}"
        )
    return _scale(dloss, target, ignore_index, reduction, acc)
