"""Numerical derivatives and the error a gradient check measures: central differences, random projections, and
``GradResult``, one checked tensor's verdict.

The relative error of a gradient tensor g against a reference r is  max|g - r| / max(max|g|, max|r|, 1e-12):
relative to the tensor's largest entry rather than element by element, because central differences leave an
absolute error of ~1e-10 (float64 round-off / eps) that would look huge next to an entry near zero.  With
eps = 1e-6 the expected error is ~1e-9 against numeric and ~1e-15 against autograd; the tolerance is 1e-7.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

EPS = 1e-6
RTOL = 1e-7
PROJECTIONS = 3  # random directions per tensor in fast mode


@dataclass
class GradResult:
    """The check of one tensor's gradient.  ``worst_index`` is where hand and numeric differ most
    (in fast mode: ``()``, and expected/actual are the directional derivatives along the worst direction)."""

    name: str
    tensor: str
    max_abs_diff: float
    rel_numeric: float
    rel_autograd: float | None  # None only for a layer that declares itself opaque to autograd
    worst_index: tuple[int, ...]
    expected: float  # numeric gradient at worst_index
    actual: float  # hand-written gradient at worst_index
    rtol: float
    fast: bool = False
    problem: str | None = None  # a fault the numbers alone do not show: .grad overwritten, dout changed in place

    @property
    def passed(self) -> bool:
        ok_auto = self.rel_autograd is None or self.rel_autograd < self.rtol
        return self.rel_numeric < self.rtol and ok_auto and self.problem is None

    def describe(self) -> str:
        auto = "n/a (opaque to autograd)" if self.rel_autograd is None else f"{self.rel_autograd:.2e}"
        where = "worst random projection" if self.fast else f"worst at index {self.worst_index}"
        text = (
            f"{self.name} {self.tensor}: rel error {self.rel_numeric:.2e} vs numeric, {auto} vs autograd; "
            f"{where}: numeric {self.expected:.10g}, hand-written {self.actual:.10g}"
        )
        return text if self.problem is None else f"{text}; {self.problem}"


def rel_error(a: Tensor, b: Tensor) -> float:
    """max|a - b| / max(max|a|, max|b|, 1e-12); 0 for empty tensors."""
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-12) if a.numel() else 1.0
    return (a - b).abs().max().item() / scale if a.numel() else 0.0


@torch.no_grad()  # perturbs in place tensors that may require gradients (a layer's parameters)
def numeric_grad(f: Callable[[], float], t: Tensor, eps: float = EPS) -> Tensor:
    """Central differences of the scalar f() with respect to every element of t (perturbed in place)."""
    grad = torch.zeros_like(t)
    for idx in itertools.product(*(range(n) for n in t.shape)):  # works for non-contiguous t too
        orig = t[idx].item()
        t[idx] = orig + eps
        fp = f()
        t[idx] = orig - eps
        fm = f()
        t[idx] = orig
        grad[idx] = (fp - fm) / (2 * eps)
    return grad


@torch.no_grad()  # perturbs in place tensors that may require gradients (a layer's parameters)
def directional_derivative(f: Callable[[], float], t: Tensor, v: Tensor, eps: float = EPS) -> float:
    """(f(t + eps v) - f(t - eps v)) / (2 eps): the derivative of f along v (t perturbed in place, restored)."""
    orig = t.clone()
    with torch.no_grad():
        t.add_(v, alpha=eps)
        fp = f()
        t.copy_(orig).sub_(v, alpha=eps)
        fm = f()
        t.copy_(orig)
    return (fp - fm) / (2 * eps)


def full_result(owner: str, name: str, h: Tensor, n: Tensor, auto: Tensor | None, rtol: float) -> GradResult:
    """The verdict on hand-written gradient ``h`` against numeric ``n`` (every entry) and autograd's ``auto``."""
    if h.shape != n.shape:
        raise ValueError(f"gradcheck {owner}: gradient of {name} has shape {tuple(h.shape)}, expected {tuple(n.shape)}")
    diff = (h - n).abs()
    flat_i = int(diff.argmax()) if diff.numel() else 0
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_i), h.shape)) if h.dim() else ()
    return GradResult(
        name=owner,
        tensor=name,
        max_abs_diff=diff.max().item() if diff.numel() else 0.0,
        rel_numeric=rel_error(h, n),
        rel_autograd=None if auto is None else rel_error(h, auto),
        worst_index=idx,
        expected=n.reshape(-1)[flat_i].item() if n.numel() else 0.0,
        actual=h.reshape(-1)[flat_i].item() if h.numel() else 0.0,
        rtol=rtol,
    )


def fast_result(
    owner: str,
    name: str,
    h: Tensor,
    f: Callable[[], float],
    t: Tensor,
    auto: Tensor | None,
    rtol: float,
    eps: float,
    seed: int,
) -> GradResult:
    """Compare <h, v> with the numeric derivative along PROJECTIONS random directions v; keep the worst."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    worst = None
    for _ in range(PROJECTIONS):
        v = torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device)
        num, ana = directional_derivative(f, t, v, eps), (h * v).sum().item()
        # Relative to sum|h_i v_i|, the size of the terms before they cancel in the sum: the same scale
        # as the full check's max|g| (a projection that happens to sum to nearly zero is not held to 1e-7).
        err = abs(num - ana) / max(abs(num), abs(ana), (h * v).abs().sum().item(), 1e-12)
        if worst is None or err > worst[0]:
            worst = (err, num, ana)
    err, num, ana = worst
    return GradResult(
        name=owner,
        tensor=name,
        max_abs_diff=abs(num - ana),
        rel_numeric=err,
        rel_autograd=None if auto is None else rel_error(h, auto),
        worst_index=(),
        expected=num,
        actual=ana,
        rtol=rtol,
        fast=True,
    )
