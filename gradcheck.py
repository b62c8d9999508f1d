"""Check hand-written backward passes twice: against central differences and against torch.autograd.

Library:   ``check_layer(layer, x)`` / ``check_loss(loss_fn, input, target)`` return one
           ``GradResult`` per checked tensor (the input and every parameter).
Command:   ``python gradcheck.py`` checks every built-in layer and loss and prints a table;
           ``--layer NAME`` checks one.  Exit status 1 on any failure.

Everything runs in float64.  The relative error of a gradient tensor g against a
reference r is  max|g - r| / max(max|g|, max|r|, 1e-12)  -- relative to the
tensor's largest entry rather than element by element, because central
differences leave an absolute error of ~1e-10 (float64 round-off / eps) that
would look huge next to an entry that happens to be near zero.  With eps=1e-6
the expected error is ~1e-9 against numeric and ~1e-15 against autograd; the
default tolerance is 1e-7.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from layers import Layer, Linear, Net, ReLU, Sigmoid, Softmax, Tanh
from layers.layer import named_parameters_of
from losses import CrossEntropyLoss, MSELoss

EPS = 1e-6
RTOL = 1e-7


@dataclass
class GradResult:
    """The check of one tensor's gradient.  ``worst_index`` is where hand and numeric differ most."""

    name: str
    tensor: str
    max_abs_diff: float
    rel_numeric: float
    rel_autograd: float | None  # None: the forward could not be traced by autograd
    worst_index: tuple[int, ...]
    expected: float  # numeric gradient at worst_index
    actual: float  # hand-written gradient at worst_index
    rtol: float

    @property
    def passed(self) -> bool:
        ok_auto = self.rel_autograd is None or self.rel_autograd < self.rtol
        return self.rel_numeric < self.rtol and ok_auto

    def describe(self) -> str:
        auto = "n/a" if self.rel_autograd is None else f"{self.rel_autograd:.2e}"
        return (f"{self.name} {self.tensor}: rel error {self.rel_numeric:.2e} vs numeric, {auto} vs autograd; "
                f"worst at index {self.worst_index}: numeric {self.expected:.10g}, hand-written {self.actual:.10g}")


def rel_error(a: Tensor, b: Tensor) -> float:
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-12) if a.numel() else 1.0
    return (a - b).abs().max().item() / scale if a.numel() else 0.0


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


def _require_float64(owner: str, tensors: dict[str, Tensor]) -> None:
    for name, t in tensors.items():
        if t.dtype != torch.float64:
            raise ValueError(f"gradcheck {owner}: {name} has dtype {t.dtype}; gradient checks need float64 "
                             f"(use .to(dtype=torch.float64) / .double())")


def _compare(owner: str, tensors: dict[str, Tensor], hand: dict[str, Tensor], num: dict[str, Tensor],
             auto: dict[str, Tensor] | None, rtol: float) -> list[GradResult]:
    results = []
    for name in tensors:
        h, n = hand[name], num[name]
        if h.shape != n.shape:
            raise ValueError(f"gradcheck {owner}: gradient of {name} has shape {tuple(h.shape)}, "
                             f"expected {tuple(n.shape)}")
        diff = (h - n).abs()
        flat_i = int(diff.argmax()) if diff.numel() else 0
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_i), h.shape)) if h.dim() else ()
        results.append(GradResult(
            name=owner, tensor=name, max_abs_diff=diff.max().item() if diff.numel() else 0.0,
            rel_numeric=rel_error(h, n), rel_autograd=None if auto is None else rel_error(h, auto[name]),
            worst_index=idx, expected=n.reshape(-1)[flat_i].item() if n.numel() else 0.0,
            actual=h.reshape(-1)[flat_i].item() if h.numel() else 0.0, rtol=rtol))
    return results


def _autograd(fn: Callable[[], Tensor], leaves: list[Tensor], dout: Tensor | None) -> list[Tensor] | None:
    """Gradients of fn() (contracted with dout) w.r.t. leaves by torch.autograd; None if fn is not traceable."""
    try:
        with torch.enable_grad():
            for t in leaves:
                t.requires_grad_(True)
            out = fn()
            if not out.requires_grad:
                return None
            grads = torch.autograd.grad(out, leaves, dout, allow_unused=True)
    except RuntimeError:
        return None
    finally:
        for t in leaves:
            t.requires_grad_(False)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]


def check_layer(layer: Layer, x: Tensor, dout: Tensor | None = None, *, eps: float = EPS, rtol: float = RTOL,
                name: str | None = None, seed: int = 0) -> list[GradResult]:
    """Check ``layer.backward`` for the input and every parameter, in float64.

    dout (the upstream gradient) defaults to a seeded random tensor, so every
    entry of the Jacobian contributes.  The layer's existing ``.grad``s are left
    as they were.
    """
    owner = name or repr(layer).split("\n")[0]
    x = x.detach().clone()  # contiguous, ours to perturb
    params = named_parameters_of(layer)
    tensors = {"x": x, **dict(params)}
    if len(tensors) != len(params) + 1:
        raise ValueError(f"gradcheck {owner}: a parameter is named 'x' or two share a name")
    _require_float64(owner, tensors)
    with torch.no_grad():
        out = layer.forward(x)
    if dout is None:
        g = torch.Generator(device="cpu").manual_seed(seed)
        dout = torch.randn(out.shape, generator=g, dtype=out.dtype).to(out.device)
    _require_float64(owner, {"dout": dout})

    saved = [p.grad for _, p in params]
    try:
        for _, p in params:
            p.grad = None
        with torch.no_grad():
            layer.forward(x)
            dx = layer.backward(dout)
        hand = {"x": dx, **{n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in params}}
    finally:
        for (_, p), gsave in zip(params, saved):
            p.grad = gsave

    leaves = list(tensors.values())
    xa = x.clone()
    auto_list = _autograd(lambda: layer.forward(xa), [xa] + leaves[1:], dout)
    auto = None if auto_list is None else dict(zip(tensors, auto_list))

    def f() -> float:
        with torch.no_grad():
            return (layer.forward(x) * dout).sum().item()

    num = {n: numeric_grad(f, t, eps) for n, t in tensors.items()}
    return _compare(owner, tensors, hand, num, auto, rtol)


def check_loss(loss_fn, input: Tensor, target: Tensor, *, eps: float = EPS, rtol: float = RTOL,
               name: str | None = None) -> list[GradResult]:
    """Check ``loss_fn.backward()`` (dL/dinput) for a loss with the ``crit(input, target)`` interface."""
    owner = name or repr(loss_fn)
    x = input.detach().clone()
    _require_float64(owner, {"input": x})
    with torch.no_grad():
        loss_fn(x, target)
        hand = {"input": loss_fn.backward()}
    xa = x.clone()
    auto_list = _autograd(lambda: loss_fn(xa, target), [xa], None)

    def f() -> float:
        with torch.no_grad():
            return loss_fn(x, target).item()

    return _compare(owner, {"input": x}, hand, {"input": numeric_grad(f, x, eps)},
                    None if auto_list is None else {"input": auto_list[0]}, rtol)


# -- the command ----------------------------------------------------------------------------------------

def _away_from_zero(x: Tensor, margin: float = 1e-2) -> Tensor:
    """Push entries off the ReLU kink, where the derivative is undefined and differences straddle it."""
    return torch.where(x.abs() < margin, x.sign() * margin + (x == 0) * margin, x)


def builtin_cases() -> dict[str, list[Callable[[], list[GradResult]]]]:
    """Every built-in layer and loss, on several shapes (including N=1), in float64."""
    f64 = torch.float64

    def rnd(*shape: int, scale: float = 1.0) -> Tensor:
        return torch.randn(*shape, dtype=f64) * scale

    def layer_case(label: str, make: Callable[[], Layer], *shape: int, kink: bool = False, scale: float = 1.0):
        def run() -> list[GradResult]:
            x = rnd(*shape, scale=scale)
            return check_layer(make(), _away_from_zero(x) if kink else x, name=f"{label} x{tuple(shape)}")
        return run

    def loss_case(label: str, make, input_shape, target_fn):
        def run() -> list[GradResult]:
            x = rnd(*input_shape, scale=3.0)
            return check_loss(make(), x, target_fn(x), name=f"{label} x{tuple(input_shape)}")
        return run

    idx = lambda x: torch.randint(0, x.shape[1], (x.shape[0],))  # noqa: E731
    probs = lambda x: torch.softmax(torch.randn_like(x), 1)  # noqa: E731
    same = lambda x: torch.randn_like(x)  # noqa: E731
    return {
        "linear": [layer_case("Linear(7,5)", lambda: Linear(7, 5, dtype=f64), 4, 7),
                   layer_case("Linear(3,6)", lambda: Linear(3, 6, dtype=f64), 1, 3),
                   layer_case("Linear(5,4,bias=False)", lambda: Linear(5, 4, bias=False, dtype=f64), 3, 5)],
        "relu": [layer_case("ReLU", ReLU, 4, 9, kink=True), layer_case("ReLU", ReLU, 1, 5, kink=True),
                 layer_case("ReLU", ReLU, 2, 3, 4, kink=True)],
        "tanh": [layer_case("Tanh", Tanh, 4, 9), layer_case("Tanh", Tanh, 1, 5, scale=3.0)],
        "sigmoid": [layer_case("Sigmoid", Sigmoid, 4, 9), layer_case("Sigmoid", Sigmoid, 1, 5, scale=3.0)],
        "softmax": [layer_case("Softmax", Softmax, 4, 9), layer_case("Softmax", Softmax, 1, 5, scale=2.0),
                    layer_case("Softmax(dim=0)", lambda: Softmax(dim=0), 6, 3),
                    layer_case("Softmax(dim=1)", lambda: Softmax(dim=1), 2, 4, 3)],
        "net": [layer_case("Net(5-6-6-3)", lambda: Net(hidden_size=6, num_classes=3, in_features=5, depth=2,
                                                       dtype=f64), 4, 5),
                layer_case("Net(tanh,sigmoid,softmax)",
                           lambda: Net(layers=[Linear(4, 5, dtype=f64), Tanh(), Linear(5, 5, dtype=f64), Sigmoid(),
                                               Linear(5, 3, dtype=f64), Softmax()]), 1, 4)],
        "crossentropyloss": [
            loss_case("CrossEntropy", CrossEntropyLoss, (5, 4), idx),
            loss_case("CrossEntropy(sum)", lambda: CrossEntropyLoss("sum"), (1, 6), idx),
            loss_case("CrossEntropy(smooth=0.1)", lambda: CrossEntropyLoss(label_smoothing=0.1), (5, 4), idx),
            loss_case("CrossEntropy(probs)", CrossEntropyLoss, (3, 5), probs),
            loss_case("CrossEntropy(probs,sum,smooth=0.2)", lambda: CrossEntropyLoss("sum", label_smoothing=0.2),
                      (3, 5), probs)],
        "mseloss": [loss_case("MSE", MSELoss, (4, 3), same), loss_case("MSE(sum)", lambda: MSELoss("sum"), (1, 7), same),
                    loss_case("MSE", MSELoss, (2, 3, 4), same)],
    }


def main(argv: list[str] | None = None) -> int:
    cases = builtin_cases()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layer", metavar="NAME", help=f"check one of: {', '.join(cases)} (case-insensitive)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.layer is not None and args.layer.lower() not in cases:
        ap.error(f"unknown layer {args.layer!r}; known: {', '.join(cases)}")
    selected = {k: v for k, v in cases.items() if args.layer is None or k == args.layer.lower()}
    results = []
    for key, runs in selected.items():
        for i, run in enumerate(runs):
            torch.manual_seed(args.seed + 1000 * list(cases).index(key) + i)  # same inputs with or without --layer
            results += run()

    w = max(len(r.name) for r in results)
    tw = max(len(r.tensor) for r in results)
    print(f"{'layer':<{w}}  {'tensor':<{tw}} {'max abs diff':>12} {'rel vs numeric':>14} {'rel vs autograd':>15}  result")
    for r in results:
        auto = "n/a" if r.rel_autograd is None else f"{r.rel_autograd:.2e}"
        print(f"{r.name:<{w}}  {r.tensor:<{tw}} {r.max_abs_diff:>12.2e} {r.rel_numeric:>14.2e} {auto:>15}  "
              f"{'PASS' if r.passed else 'FAIL'}")
    failed = [r for r in results if not r.passed]
    worst_num = max(results, key=lambda r: r.rel_numeric)
    worst_auto = max((r.rel_autograd or 0.0) for r in results)
    print(f"\n{len(results) - len(failed)} passed, {len(failed)} failed "
          f"(tolerance {RTOL:g}; worst relative error {worst_num.rel_numeric:.2e} vs numeric "
          f"[{worst_num.name} {worst_num.tensor}], {worst_auto:.2e} vs autograd)")
    for r in failed:
        print("FAIL: " + r.describe(), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
