"""Comparing a learner's tensor with the expected one: the error, the worst entry, and what the difference looks like.

The relative error of a tensor is max|actual - expected| / max(max|actual|, max|expected|, 1e-30): relative to
the tensor's largest entry, so that an entry near zero does not blow it up (CS231n's rel_error, floored).  In
float64 a right answer differs from autograd by round-off, ~1e-16; RIGHT accepts 1e-9.  A wrong answer
"equals" a known mistake when it is within SAME of that mistake's formula.
"""

from __future__ import annotations

import torch
from torch import Tensor

RIGHT = 1e-9
SAME = 1e-7


def shape_of(t: object) -> str:
    if isinstance(t, Tensor):
        return str(tuple(t.shape))
    return "None" if t is None else f"a {type(t).__name__}, not a tensor"


def rel_error(actual: Tensor, expected: Tensor) -> float:
    """max|actual - expected| relative to the larger tensor's largest entry; inf for a shape mismatch or a nan."""
    if not isinstance(actual, Tensor) or actual.shape != expected.shape:
        return float("inf")
    if expected.numel() == 0:
        return 0.0
    a, e = actual.double(), expected.double()
    if not torch.isfinite(a).all():
        return float("inf")
    scale = max(a.abs().max().item(), e.abs().max().item(), 1e-30)
    return (a - e).abs().max().item() / scale


def same(actual: object, expected: Tensor, tol: float = SAME) -> bool:
    return isinstance(actual, Tensor) and rel_error(actual, expected) < tol


def worst(actual: Tensor, expected: Tensor) -> tuple[tuple[int, ...], float, float]:
    """(index, expected value, actual value) where they differ most (a nan counts as the worst)."""
    diff = (actual.double() - expected.double()).abs().nan_to_num(nan=float("inf"))
    flat = int(diff.reshape(-1).argmax())
    return unravel(flat, actual.shape), expected.reshape(-1)[flat].item(), actual.reshape(-1)[flat].item()


def unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The row-major index of entry ``flat`` in ``shape`` (() for a scalar), in plain Python: torch.unravel_index
    imports torch's symbolic-shape machinery, about 0.4 s of a check."""
    index = []
    for n in reversed(shape):
        flat, i = divmod(flat, n)
        index.append(i)
    return tuple(reversed(index))


def describe(name: str, actual: object, expected: Tensor) -> str:
    """One line: what is wrong with ``actual`` (type, dtype, shape, or the worst entry)."""
    if not isinstance(actual, Tensor):
        return f"{name}: expected a tensor of shape {tuple(expected.shape)}, got {shape_of(actual)}"
    if actual.shape != expected.shape:
        return f"{name}: expected shape {tuple(expected.shape)}, got {tuple(actual.shape)}"
    if actual.dtype != expected.dtype:
        return f"{name}: expected dtype {expected.dtype}, got {actual.dtype} (keep everything in float64)"
    index, e, a = worst(actual, expected)
    at = f"[{', '.join(map(str, index))}]" if index else ""
    return (
        f"{name}: worst at {name}{at}: expected {e:.10g}, yours {a:.10g} "
        f"(relative error {rel_error(actual, expected):.1e})"
    )


PRECISION = 1e-4  # a difference between round-off and this, with every entry close: float32 somewhere


def diagnose(name: str, actual: Tensor, expected: Tensor, others: dict[str, Tensor], nan_hint: str = "") -> list[str]:
    """What the difference looks like, for an answer that matches no known mistake."""
    if not isinstance(actual, Tensor) or actual.shape != expected.shape:
        return []
    a, e = actual.double(), expected.double()
    if not torch.isfinite(a).all():
        where = nan_hint or (
            "a division by zero, a log or sqrt of a negative number or zero, or an exp that overflowed"
        )
        bad = (~torch.isfinite(a)).sum().item()
        return [f"{bad} of {a.numel()} entries of your {name} are nan or inf: {where}"]
    err = rel_error(a, e)
    if err < PRECISION:
        return [
            f"your {name} is close but not right (relative error {err:.1e}: float64 round-off is about 1e-16): "
            f"float32 somewhere.  torch.zeros(shape) and torch.tensor(...) of Python floats make float32 tensors, "
            f"and .float() rounds to float32: pass dtype=torch.float64, or use zeros_like(x)"
        ]
    if a.abs().max() == 0:
        return [
            f"your {name} is all zeros: no gradient reached it (is the right .grad added to, is the result "
            f"returned, does the chain reach this tensor?)"
        ]
    for other, t in others.items():
        if other != name and isinstance(t, Tensor) and t.shape == e.shape and same(a, t):
            return [
                f"your {name} equals the expected {other}: two results swapped (check the order you return "
                f"them in, or which tensor you add into)"
            ]
    k = (a * e).sum() / (e * e).sum().clamp_min(1e-300)  # the best factor a = k e
    if a.numel() > 1 and same(a, k * e) and abs(k.item() - 1) > 1e-6:  # any two scalars differ by a factor
        k = k.item()
        if abs(k + 1) < 1e-6:
            return [f"your {name} has the wrong sign everywhere: a minus sign lost or added"]
        return [
            f"your {name} is the right one times {k:.6g} (= 1/{1 / k:.6g}) everywhere: a missing or extra "
            f"constant factor (a 2, a 1/N, a scale?)"
        ]
    wrong = (a - e).abs() > RIGHT * max(a.abs().max().item(), e.abs().max().item())
    lines = [f"{int(wrong.sum())} of {wrong.numel()} entries of {name} are wrong"]
    if a.dim() >= 2 and 0 < int(wrong.sum()) < wrong.numel():
        rows = wrong.reshape(wrong.shape[0], -1).any(1).nonzero().reshape(-1).tolist()
        cols = wrong.transpose(0, 1).reshape(wrong.shape[1], -1).any(1).nonzero().reshape(-1).tolist()
        if len(rows) < wrong.shape[0]:
            lines.append(f"only in {name}[i] for i in {rows} (along the first axis): the others are right")
        elif len(cols) < wrong.shape[1]:
            lines.append(f"only in {name}[:, j] for j in {cols} (along the second axis): the others are right")
    return ["; ".join(lines)]


def vjp(outputs: list[Tensor], inputs: list[Tensor], grad_outputs: list[Tensor]) -> tuple[Tensor | None, ...]:
    """The gradients of sum_k <outputs[k], grad_outputs[k]> w.r.t. ``inputs`` (None where unused): what
    ``torch.autograd.grad(outputs, inputs, grad_outputs)`` gives, written as one scalar so that torch does not import
    its symbolic-shape machinery (about 0.4 s of a check) to compare the shapes of ``grad_outputs``."""
    total = sum((o * g).sum() for o, g in zip(outputs, grad_outputs, strict=True))
    return torch.autograd.grad(total, inputs, allow_unused=True)
