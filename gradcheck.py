"""Check hand-written backward passes twice: against central differences and against torch.autograd.

Library:   ``check_layer(layer, x)`` / ``check_loss(loss_fn, input, target)`` return one
           ``GradResult`` per checked tensor (the input and every parameter).
Command:   ``python gradcheck.py`` checks every built-in layer and loss and prints a table;
           ``--layer NAME`` checks one, ``--fast`` uses random projections.  Exit status 1 on any failure.

Everything runs in float64.  The relative error of a gradient tensor g against a
reference r is  max|g - r| / max(max|g|, max|r|, 1e-12)  -- relative to the
tensor's largest entry rather than element by element, because central
differences leave an absolute error of ~1e-10 (float64 round-off / eps) that
would look huge next to an entry that happens to be near zero.  With eps=1e-6
the expected error is ~1e-9 against numeric and ~1e-15 against autograd; the
default tolerance is 1e-7.

``fast=True`` checks random projections of the Jacobian instead of every entry, as
``torch.autograd.gradcheck(fast_mode=True)`` does: the scalar f = sum(out * dout) (dout
random: a random left projection) is differentiated along random directions v, so
(f(t + eps v) - f(t - eps v)) / 2eps must equal <grad, v>: two forwards per direction
instead of two per element.  The error is measured relative to sum|grad * v| (the size of the
terms before they cancel).  The comparison with autograd stays full.

The upstream gradient is random, never ones: the gradient of sum(out) through batch norm
is zero and would pass any check.  Every forward of a check runs with the same seeded
random state, so a layer that draws (dropout) draws the same mask each time; buffers a
forward updates (running statistics) and existing ``.grad``s are restored afterwards.
A layer that cannot be traced by autograd must say so (``autograd_opaque = True``);
for any other layer a failure of the autograd oracle is an error, never a silent pass.

Two faults the numbers of one backward cannot show are checked too.  Backward runs a second
time on parameters whose ``.grad`` already holds a random tensor: it must *add* its gradient
(``+=``), or a reused layer and gradient accumulation over micro-batches come out wrong;
``self.weight.grad = dW`` is reported by the parameter's name.  And backward is handed
copies of dout, compared afterwards: a backward that changes dout in place (``dout[mask] = 0``)
hands the layer before it changed values in a network, and is reported too.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.utils._pytree
from torch import Tensor

from layers import GELU, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv2d, Dropout, Embedding, Flatten, Layer, LayerNorm, LeakyReLU, Linear, LogSoftmax, MaxPool2d, MultiheadAttention, ReLU, ScaledDotProductAttention, Sequential, Sigmoid, SiLU, Softmax, SyncBatchNorm, Tanh, TransformerEncoder, TransformerEncoderLayer, attention_dropout_mask
from models import GPT, Net
from layers.reference import attention_backward, attention_bias, attention_forward
from layers import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from models import RecurrentLM, seeded_dropouts
from layers.layer import named_parameters_of
from losses import CrossEntropyLoss, MSELoss

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
        text = (f"{self.name} {self.tensor}: rel error {self.rel_numeric:.2e} vs numeric, {auto} vs autograd; "
                f"{where}: numeric {self.expected:.10g}, hand-written {self.actual:.10g}")
        return text if self.problem is None else f"{text}; {self.problem}"


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


def _require_float64(owner: str, tensors: dict[str, Tensor]) -> None:
    for name, t in tensors.items():
        if t.dtype != torch.float64:
            raise ValueError(f"gradcheck {owner}: {name} has dtype {t.dtype}; gradient checks need float64 "
                             f"(use .to(dtype=torch.float64) / .double())")


def _result(owner: str, name: str, h: Tensor, n: Tensor, auto: Tensor | None, rtol: float) -> GradResult:
    if h.shape != n.shape:
        raise ValueError(f"gradcheck {owner}: gradient of {name} has shape {tuple(h.shape)}, "
                         f"expected {tuple(n.shape)}")
    diff = (h - n).abs()
    flat_i = int(diff.argmax()) if diff.numel() else 0
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_i), h.shape)) if h.dim() else ()
    return GradResult(name=owner, tensor=name, max_abs_diff=diff.max().item() if diff.numel() else 0.0,
                      rel_numeric=rel_error(h, n), rel_autograd=None if auto is None else rel_error(h, auto),
                      worst_index=idx, expected=n.reshape(-1)[flat_i].item() if n.numel() else 0.0,
                      actual=h.reshape(-1)[flat_i].item() if h.numel() else 0.0, rtol=rtol)


def _fast_result(owner: str, name: str, h: Tensor, f: Callable[[], float], t: Tensor, auto: Tensor | None,
                 rtol: float, eps: float, seed: int) -> GradResult:
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
    return GradResult(name=owner, tensor=name, max_abs_diff=abs(num - ana), rel_numeric=err,
                      rel_autograd=None if auto is None else rel_error(h, auto), worst_index=(),
                      expected=num, actual=ana, rtol=rtol, fast=True)


def _autograd(owner: str, fn: Callable[[], Tensor | tuple], leaves: list[Tensor], dout: Tensor | None,
              opaque: bool) -> list[Tensor] | None:
    """Gradients of fn() (contracted with dout) w.r.t. leaves by torch.autograd.  ``fn`` may instead return
    (outputs, their upstream gradients), two lists.

    None only for a layer that declared itself opaque to autograd; for any other, a forward that autograd
    cannot trace is an error (it used to count as a pass, which let a crash print PASS).
    """
    if opaque:
        return None
    try:
        with torch.enable_grad():
            for t in leaves:
                t.requires_grad_(True)
            out = fn()
            outs, douts = out if isinstance(out, tuple) else ([out], [dout])
            if not any(o.requires_grad for o in outs):
                raise RuntimeError("the output does not depend on any input through operations autograd records")
            outs, douts = zip(*[(o, d) for o, d in zip(outs, douts) if o.requires_grad])
            grads = torch.autograd.grad(outs, leaves, douts, allow_unused=True)
    except RuntimeError as e:
        raise RuntimeError(f"gradcheck {owner}: torch.autograd could not differentiate the forward ({e}); a layer "
                           f"whose forward autograd cannot trace must set autograd_opaque = True") from e
    finally:
        for t in leaves:
            t.requires_grad_(False)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)]


def _same_randomness(seed: int, device: torch.device):
    """Each forward inside draws the same random numbers (dropout's mask), leaving the global RNG as it was."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []))
    torch.manual_seed(seed)
    return stack


def _input_names(layer: Layer, count: int) -> list[str]:
    """Names for the forward's positional inputs: its signature's (query, key, value; x, hx), else x0, x1, ..."""
    if count == 1:
        return ["x"]
    try:
        params = [p.name for p in inspect.signature(layer.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return params[:count] if len(params) >= count else [f"x{i}" for i in range(count)]


def _leaf_names(name: str, value: object) -> list[tuple[str, object]]:
    """(name, leaf) for an input that may be a tuple of tensors (an LSTM's (h, c)): "hx[0]", "hx[1]"."""
    if isinstance(value, (tuple, list)):
        return [pair for i, v in enumerate(value) for pair in _leaf_names(f"{name}[{i}]", v)]
    return [(name, value)]


def _checked(t: object) -> bool:
    """An input whose gradient is checked: a floating-point tensor (token ids, boolean masks are not)."""
    return isinstance(t, Tensor) and t.is_floating_point()


def check_layer(layer: Layer, x: Tensor | tuple, dout: Tensor | tuple | None = None, *, eps: float = EPS,
                rtol: float = RTOL, name: str | None = None, seed: int = 0, fast: bool = False,
                forward_kwargs: dict | None = None) -> list[GradResult]:
    """Check ``layer.backward`` for the input and every parameter, in float64.

    ``x``: the input, or a tuple of the forward's positional inputs (``(query, key, value)``; an LSTM's
    ``(x, (h0, c0))``); keyword arguments (masks, flags) go in ``forward_kwargs``.  Floating-point inputs
    are checked; integer ones (token ids) are passed through and must get None as their gradient.
    The forward may return a tensor or a tuple of them (attention's (out, weights), an LSTM's
    (output, (h_n, c_n))); each floating-point output gets an upstream gradient, and the backward is called
    with them in the output's structure, ``layer.backward(*douts)``, returning the inputs' gradients in the
    inputs' structure (one tensor for a single input).

    dout (the upstream gradient(s)) defaults to seeded random tensors, so every entry of the Jacobian
    contributes.  The layer's existing ``.grad``s and buffers are left as they were.  ``fast=True``:
    random projections (see the module docstring).

    Backward also runs once more on ``.grad``s pre-filled with random values (it must add to them) and is
    given copies of dout (it must not change them): a fault is a failed ``GradResult`` whose ``problem`` says
    which parameter's ``.grad`` was overwritten, or which dout was changed.  An exception inside backward (a
    shape bug: torch's bare "mat1 and mat2 shapes cannot be multiplied") is raised again naming the layer,
    the shapes of dout it was given and of the gradients it should give.
    """
    if not (callable(getattr(layer, "forward", None)) and callable(getattr(layer, "backward", None))):
        raise TypeError(f"gradcheck: check_layer needs a layer, an object with forward(x) and backward(dout) "
                        f"methods (and parameters() if it has any), got {type(layer).__name__} {layer!r:.60}; "
                        f"a plain function has no hand-written backward to check")
    owner = name or repr(layer).split("\n")[0]
    kwargs = forward_kwargs or {}
    multi = isinstance(x, tuple)
    args = x if multi else (x,)
    args = torch.utils._pytree.tree_map(lambda t: t.detach().clone() if _checked(t) else t, args)  # ours to perturb
    in_leaves, in_spec = torch.utils._pytree.tree_flatten(args)
    in_names = [n for arg_name, arg in zip(_input_names(layer, len(args)), args) for n, _ in _leaf_names(arg_name, arg)]
    checked = [i for i, t in enumerate(in_leaves) if _checked(t)]
    params = named_parameters_of(layer)
    tensors = {**{in_names[i]: in_leaves[i] for i in checked}, **dict(params)}
    if len(tensors) != len(params) + len(checked):
        raise ValueError(f"gradcheck {owner}: a parameter has the name of an input, or two share a name")
    if not tensors:
        raise ValueError(f"gradcheck {owner}: nothing to check (no floating-point input and no parameters)")
    _require_float64(owner, tensors)
    buffers = [(b, b.clone()) for _, b in getattr(layer, "named_buffers", lambda: [])()]
    opaque = bool(getattr(layer, "autograd_opaque", False))
    asks_dx = "need_input_grad" in inspect.signature(layer.backward).parameters

    def forward(leaves: list) -> object:
        with _same_randomness(seed + 1, next(t for t in tensors.values()).device):
            return layer.forward(*torch.utils._pytree.tree_unflatten(leaves, in_spec), **kwargs)

    def outputs(out: object) -> list[Tensor | None]:  # the outputs that take an upstream gradient, None elsewhere
        return [t if _checked(t) else None for t in torch.utils._pytree.tree_leaves(out)]

    saved = [p.grad for _, p in params]

    def run_backward(douts: list) -> object:
        """layer.backward on copies of ``douts`` (each one's change in place is reported); a failure inside it is
        re-raised naming the layer and the shapes it was given and should give back."""
        copies = [None if d is None else d.clone() for d in douts]
        dargs = torch.utils._pytree.tree_unflatten(copies, out_spec)
        dargs = dargs if isinstance(dargs, tuple) else (dargs,)
        try:
            grads = layer.backward(*dargs, need_input_grad=True) if asks_dx else layer.backward(*dargs)
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            raise _placed(e, f"gradcheck {owner}: {type(layer).__name__}.backward failed, "
                             f"{_backward_shapes(douts, in_names, in_leaves, checked, params)}: ") from e
        for i, (d, c) in enumerate(zip(douts, copies)):
            if d is not None and not torch.equal(d, c):
                changed[f"dout[{i}]" if len(douts) > 1 else "dout"] = (c - d).abs().max().item()
        return grads

    changed: dict[str, float] = {}  # dout name -> the largest change backward made to it in place
    try:
        with torch.no_grad():
            out = forward(in_leaves)
        out_leaves, out_spec = torch.utils._pytree.tree_flatten(out)
        if dout is None:
            g = torch.Generator(device="cpu").manual_seed(seed)
            douts = [torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device) if t is not None else None
                     for t in outputs(out)]
        else:
            douts = torch.utils._pytree.tree_leaves(dout, is_leaf=lambda t: t is None) if isinstance(dout, tuple) \
                else [dout]
        if len(douts) != len(out_leaves):
            raise ValueError(f"gradcheck {owner}: {len(douts)} upstream gradients for {len(out_leaves)} outputs")
        _require_float64(owner, {f"dout[{i}]": d for i, d in enumerate(douts) if d is not None})
        for _, p in params:
            p.grad = None
        with torch.no_grad():
            forward(in_leaves)
            grads = run_backward(douts)
        grad_leaves = torch.utils._pytree.tree_leaves(grads if multi else (grads,), is_leaf=lambda t: t is None)
        if len(grad_leaves) != len(in_leaves):
            raise TypeError(f"gradcheck {owner}: backward returned {len(grad_leaves)} gradients for "
                            f"{len(in_leaves)} inputs ({', '.join(in_names)}), in the inputs' structure")
        hand = {}
        for i, (n, g) in enumerate(zip(in_names, grad_leaves)):
            if i in checked and not isinstance(g, Tensor):
                raise TypeError(f"gradcheck {owner}: backward returned {type(g).__name__} for input {n}, "
                                f"not its gradient")
            if i not in checked and g is not None:
                raise TypeError(f"gradcheck {owner}: backward returned a gradient for {n}, which has none "
                                f"(not a floating-point tensor): return None there")
            if i in checked:
                hand[n] = g
        hand.update({n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in params})
        received = {n for n, p in params if p.grad is not None}

        # Again, on .grads that already hold something (of the gradient's size, so that adding loses no digits of
        # a small gradient): backward must add to them.
        g = torch.Generator(device="cpu").manual_seed(seed + 3)
        before = {n: torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device)
                  * (hand[n].abs().max().item() or 1.0) for n, p in params}
        for n, p in params:
            p.grad = before[n].clone()
        with torch.no_grad():
            forward(in_leaves)
            run_backward(douts)
        problems = {n: _accumulation_problem(n, p.grad, before[n], hand[n], rtol) for n, p in params
                    if n in received}
        if changed:
            first = next(iter(tensors))
            problems[first] = "; ".join(p for p in (problems.get(first), _dout_problem(changed)) if p)
        for _, p in params:
            p.grad = None

        auto_leaves = [t.clone() if i in checked else t for i, t in enumerate(in_leaves)]
        auto_inputs = [auto_leaves[i] for i in checked]

        def auto_fn() -> tuple[list[Tensor], list[Tensor]]:
            outs = outputs(forward(auto_leaves))
            return [o for o, d in zip(outs, douts) if o is not None and d is not None], [d for d in douts if d is not None]

        auto_list = _autograd(owner, auto_fn, auto_inputs + [p for _, p in params], None, opaque)
        auto = dict.fromkeys(tensors) if auto_list is None else dict(zip(tensors, auto_list))

        def f() -> float:
            with torch.no_grad():
                outs = outputs(forward(in_leaves))
                return sum((o * d).sum().item() for o, d in zip(outs, douts) if o is not None and d is not None)

        if fast:
            results = [_fast_result(owner, n, hand[n], f, t, auto[n], rtol, eps, seed + 7 + i)
                       for i, (n, t) in enumerate(tensors.items())]
        else:
            results = [_result(owner, n, hand[n], numeric_grad(f, t, eps), auto[n], rtol) for n, t in tensors.items()]
        for r in results:
            r.problem = problems.get(r.tensor)
        return results
    finally:
        for (_, p), gsave in zip(params, saved):
            p.grad = gsave
        for b, value in buffers:
            b.copy_(value)


def _accumulation_problem(name: str, after: Tensor | None, before: Tensor, grad: Tensor, rtol: float) -> str | None:
    """What is wrong with ``name``.grad after a backward that found ``before`` there and should have added ``grad``
    (the gradient it gave from an empty .grad), or None."""
    if after is None:
        return f"backward set {name}.grad to None, dropping the gradient it held: add into it ({name}.grad += ...)"
    if after.shape != before.shape:
        return f"backward left {name}.grad of shape {tuple(after.shape)}, but {name} has shape {tuple(before.shape)}"
    if rel_error(after - before, grad) < rtol:
        return None
    if rel_error(after, grad) < rtol:
        return (f"backward overwrites {name}.grad instead of adding to it: a reused layer or accumulated "
                f"micro-batches lose all but the last gradient; write {name}.grad += ... (or "
                f"{name}.grad = {name}.grad + ... where it may be None), not {name}.grad = ...")
    return (f"backward does not add its gradient to what {name}.grad held (with .grad pre-filled, .grad after minus "
            f"before is {rel_error(after - before, grad):.2e} from the gradient it gives from an empty .grad)")


def _dout_problem(changed: dict[str, float]) -> str:
    names = ", ".join(f"{n} (by up to {v:.3g})" for n, v in changed.items())
    return (f"backward changed its upstream gradient {names} in place: in a network the layer before it would "
            f"receive changed values; compute into a new tensor (dout * mask, not dout.mul_(mask) or dout[...] = 0)")


def _backward_shapes(douts: list, in_names: list[str], in_leaves: list, checked: list[int],
                     params: list[tuple[str, Tensor]]) -> str:
    """"given dout of shape (2, 5) (its output's); it should return dx of shape (2, 3) and leave weight.grad (5, 3),
    bias.grad (5,)": what check_layer handed a backward and what it expects back."""
    given = [tuple(d.shape) for d in douts if d is not None]
    given_text = (f"given dout of shape {given[0]}" if len(given) == 1
                  else f"given douts of shapes {', '.join(map(str, given))}") + " (the shape of its output)"
    wants = [f"d{in_names[i]} of shape {tuple(in_leaves[i].shape)}" for i in checked]
    wants += [f"{n}.grad of shape {tuple(p.shape)}" for n, p in params]
    return f"{given_text}; it should give {', '.join(wants)}" if wants else given_text


def _placed(e: Exception, where: str) -> Exception:
    """``e`` with ``where`` in front of its message, of the same type (``e`` itself if its type takes other
    arguments)."""
    try:
        return type(e)(where + str(e))
    except Exception:
        return e


def check_loss(loss_fn, input: Tensor, target: Tensor, *, eps: float = EPS, rtol: float = RTOL,
               name: str | None = None) -> list[GradResult]:
    """Check ``loss_fn.backward()`` (dL/dinput) for a loss with the ``crit(input, target)`` interface."""
    owner = name or repr(loss_fn)
    x = input.detach().clone()
    _require_float64(owner, {"input": x})
    with torch.no_grad():
        loss_fn(x, target)
        hand = loss_fn.backward()
    xa = x.clone()
    auto_list = _autograd(owner, lambda: loss_fn(xa, target), [xa], None,
                          bool(getattr(loss_fn, "autograd_opaque", False)))

    def f() -> float:
        with torch.no_grad():
            return loss_fn(x, target).item()

    return [_result(owner, "input", hand, numeric_grad(f, x, eps), None if auto_list is None else auto_list[0],
                    rtol)]


# -- the command ----------------------------------------------------------------------------------------

def _away_from_zero(x: Tensor, margin: float = 1e-2) -> Tensor:
    """Push entries off the ReLU kink, where the derivative is undefined and differences straddle it."""
    return torch.where(x.abs() < margin, x.sign() * margin + (x == 0) * margin, x)


F64 = torch.float64
Case = Callable[[bool], list[GradResult]]  # run(fast) -> results


def rnd(*shape: int, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, dtype=F64) * scale


def layer_case(label: str, make: Callable[[], Layer], *shape: int, kink: bool = False, scale: float = 1.0,
               mode: str | None = None) -> Case:
    """A check of ``make()`` on a random (shape) input; ``mode`` "train"/"eval" sets the layer's mode first;
    ``kink`` keeps inputs off a ReLU-like kink."""
    def run(fast: bool) -> list[GradResult]:
        x = rnd(*shape, scale=scale)
        layer = make()
        if mode is not None:
            layer.train(mode == "train")
        tag = f" [{mode}]" if mode else ""
        return check_layer(layer, _away_from_zero(x) if kink else x, name=f"{label}{tag} x{tuple(shape)}", fast=fast)
    return run


def loss_case(label: str, make, input_shape, target_fn) -> Case:
    def run(fast: bool) -> list[GradResult]:  # a loss has few inputs: always the full check
        x = rnd(*input_shape, scale=3.0)
        return check_loss(make(), x, target_fn(x), name=f"{label} x{tuple(input_shape)}")
    return run


def _mlp_cases() -> dict[str, list[Case]]:
    return {
        "linear": [layer_case("Linear(7,5)", lambda: Linear(7, 5, dtype=F64), 4, 7),
                   layer_case("Linear(3,6)", lambda: Linear(3, 6, dtype=F64), 1, 3),
                   layer_case("Linear(5,4,bias=False)", lambda: Linear(5, 4, bias=False, dtype=F64), 3, 5)],
        "relu": [layer_case("ReLU", ReLU, 4, 9, kink=True), layer_case("ReLU", ReLU, 1, 5, kink=True),
                 layer_case("ReLU", ReLU, 2, 3, 4, kink=True)],
        "tanh": [layer_case("Tanh", Tanh, 4, 9), layer_case("Tanh", Tanh, 1, 5, scale=3.0)],
        "sigmoid": [layer_case("Sigmoid", Sigmoid, 4, 9), layer_case("Sigmoid", Sigmoid, 1, 5, scale=3.0)],
        "softmax": [layer_case("Softmax", Softmax, 4, 9), layer_case("Softmax", Softmax, 1, 5, scale=2.0),
                    layer_case("Softmax(dim=0)", lambda: Softmax(dim=0), 6, 3),
                    layer_case("Softmax(dim=1)", lambda: Softmax(dim=1), 2, 4, 3)],
        "net": [layer_case("Net(5-6-6-3)", lambda: Net(hidden_size=6, num_classes=3, in_features=5, depth=2,
                                                       dtype=F64), 4, 5),
                layer_case("Net(tanh,sigmoid,softmax)",
                           lambda: Net(layers=[Linear(4, 5, dtype=F64), Tanh(), Linear(5, 5, dtype=F64), Sigmoid(),
                                               Linear(5, 3, dtype=F64), Softmax()]), 1, 4)],
    }


def _loss_cases() -> dict[str, list[Case]]:
    idx = lambda x: torch.randint(0, x.shape[1], (x.shape[0],))  # noqa: E731
    probs = lambda x: torch.softmax(torch.randn_like(x), 1)  # noqa: E731
    same = lambda x: torch.randn_like(x)  # noqa: E731
    return {
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


def nontrivial(layer):
    """Parameters away from their defaults (gamma off 1, beta off 0: a default can hide a missing term) and
    running statistics away from 0 and 1, so eval mode checks them too."""
    with torch.no_grad():
        for name, t in layer.named_parameters():
            t.copy_(torch.rand_like(t) + 0.5 if name.endswith("weight") else torch.randn_like(t))
        for name, t in layer.named_buffers():
            if name.endswith("running_mean"):
                t.copy_(torch.randn_like(t) * 0.5)
            elif name.endswith("running_var"):
                t.copy_(torch.rand_like(t) + 0.5)
    return layer


def _norm_cases() -> dict[str, list[Case]]:
    bn1 = lambda c, **kw: lambda: nontrivial(BatchNorm1d(c, dtype=F64, **kw))  # noqa: E731
    bn2 = lambda c, **kw: lambda: nontrivial(BatchNorm2d(c, dtype=F64, **kw))  # noqa: E731
    ln = lambda s, **kw: lambda: nontrivial(LayerNorm(s, dtype=F64, **kw))  # noqa: E731
    return {
        "batchnorm1d": [layer_case("BatchNorm1d(4)", bn1(4), 5, 4, mode="train"),
                        layer_case("BatchNorm1d(4)", bn1(4), 5, 4, mode="eval"),
                        layer_case("BatchNorm1d(3)", bn1(3), 2, 3, 4, mode="train"),
                        layer_case("BatchNorm1d(3)", bn1(3), 1, 3, 5, mode="train"),
                        layer_case("BatchNorm1d(3)", bn1(3), 1, 3, 5, mode="eval"),
                        layer_case("BatchNorm1d(3,affine=False)", bn1(3, affine=False), 4, 3, mode="train"),
                        layer_case("BatchNorm1d(3,momentum=None)", bn1(3, momentum=None), 4, 3, 2, mode="train"),
                        layer_case("BatchNorm1d(3,track_running_stats=False)", bn1(3, track_running_stats=False),
                                   4, 3, mode="eval")],
        "batchnorm2d": [layer_case("BatchNorm2d(3)", bn2(3), 2, 3, 3, 4, mode="train"),
                        layer_case("BatchNorm2d(3)", bn2(3), 2, 3, 3, 4, mode="eval"),
                        layer_case("BatchNorm2d(2)", bn2(2), 1, 2, 3, 3, mode="train"),
                        layer_case("BatchNorm2d(2,eps=0.1)", bn2(2, eps=0.1), 3, 2, 2, 2, mode="train")],
        # Outside a process group (as here) SyncBatchNorm is BatchNorm: tests/test_sync_batchnorm.py checks the
        # synchronised path on 2 processes against this one.
        "syncbatchnorm": [layer_case("SyncBatchNorm(3)", lambda: nontrivial(SyncBatchNorm(3, dtype=F64)), 2, 3, 2, 3,
                                     mode="train"),
                          layer_case("SyncBatchNorm(3)", lambda: nontrivial(SyncBatchNorm(3, dtype=F64)), 4, 3,
                                     mode="eval")],
        "layernorm": [layer_case("LayerNorm(6)", ln(6), 4, 6), layer_case("LayerNorm(5)", ln(5), 1, 5),
                      layer_case("LayerNorm((3,4))", ln((3, 4)), 2, 3, 4),
                      layer_case("LayerNorm(4,bias=False)", ln(4, bias=False), 2, 3, 4),
                      layer_case("LayerNorm(4,elementwise_affine=False)", ln(4, elementwise_affine=False), 3, 4)],
        "dropout": [layer_case("Dropout(0.3)", lambda: Dropout(0.3), 4, 9, mode="train"),
                    layer_case("Dropout(0.3)", lambda: Dropout(0.3), 1, 2, 3, 4, mode="train"),
                    layer_case("Dropout(0.3)", lambda: Dropout(0.3), 4, 9, mode="eval")],
        "gelu": [layer_case("GELU", GELU, 4, 9, scale=2.0), layer_case("GELU(tanh)", lambda: GELU("tanh"), 1, 5, 3,
                                                                          scale=2.0)],
        "leakyrelu": [layer_case("LeakyReLU", LeakyReLU, 4, 9, kink=True),
                      layer_case("LeakyReLU(0.2)", lambda: LeakyReLU(0.2), 1, 2, 5, kink=True)],
        "silu": [layer_case("SiLU", SiLU, 4, 9, scale=2.0), layer_case("SiLU", SiLU, 1, 5)],
        "logsoftmax": [layer_case("LogSoftmax(1)", lambda: LogSoftmax(1), 4, 9, scale=2.0),
                       layer_case("LogSoftmax(0)", lambda: LogSoftmax(0), 6, 3),
                       layer_case("LogSoftmax(-1)", lambda: LogSoftmax(-1), 1, 2, 4)],
    }


def distinct(*shape: int, spacing: float = 0.05) -> Tensor:
    """A random arrangement of evenly spaced values (centred on 0): no two entries closer than ``spacing``, so
    a perturbation of eps << spacing never changes which entry is a window's maximum (max pooling's kink)."""
    n = 1
    for s in shape:
        n *= s
    return ((torch.randperm(n, dtype=F64) - (n - 1) / 2) * spacing).view(*shape)


def distinct_case(label: str, make: Callable[[], Layer], *shape: int, mode: str | None = None) -> Case:
    """``layer_case`` on an input of distinct values (``distinct``): for layers that take a maximum."""
    def run(fast: bool) -> list[GradResult]:
        layer = make()
        if mode is not None:
            layer.train(mode == "train")
        tag = f" [{mode}]" if mode else ""
        return check_layer(layer, distinct(*shape), name=f"{label}{tag} x{tuple(shape)}", fast=fast)
    return run


def _small_cnn() -> Sequential:
    """(N, 1, 8, 8) -> conv+ReLU+max pool -> conv("same", even kernel)+ReLU+avg pool -> Flatten -> Linear -> (N, 5)."""
    return Sequential(Conv2d(1, 3, 3, padding=1, dtype=F64), ReLU(), MaxPool2d(2),
                      Conv2d(3, 4, (2, 3), padding="same", dtype=F64), ReLU(), AvgPool2d(2),
                      Flatten(), Linear(16, 5, dtype=F64))


def _conv_cases() -> dict[str, list[Case]]:
    conv = lambda *a, **kw: lambda: Conv2d(*a, dtype=F64, **kw)  # noqa: E731
    return {
        "conv2d": [layer_case("Conv2d(2,3,3)", conv(2, 3, 3), 2, 2, 5, 5),
                   layer_case("Conv2d(2,4,3,stride=2,padding=1)", conv(2, 4, 3, stride=2, padding=1), 1, 2, 6, 5),
                   layer_case("Conv2d(2,3,(2,3),padding='same')", conv(2, 3, (2, 3), padding="same"), 2, 2, 4, 5),
                   layer_case("Conv2d(2,2,3,padding='valid',dilation=(1,2))",
                              conv(2, 2, 3, padding="valid", dilation=(1, 2)), 1, 2, 5, 7),
                   layer_case("Conv2d(4,4,3,dilation=2,groups=2,bias=False)",
                              conv(4, 4, 3, dilation=2, groups=2, bias=False), 1, 4, 6, 6),
                   layer_case("Conv2d(3,6,(3,2),stride=(2,1),padding=(1,0),dilation=(1,2),groups=3)",
                              conv(3, 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=3),
                              2, 3, 7, 6)],
        "maxpool2d": [distinct_case("MaxPool2d(2)", lambda: MaxPool2d(2), 2, 2, 4, 5),
                      distinct_case("MaxPool2d(3,stride=2,padding=1)", lambda: MaxPool2d(3, 2, 1), 1, 2, 5, 6),
                      distinct_case("MaxPool2d(3,stride=1,dilation=(1,2),ceil_mode=True)",
                                    lambda: MaxPool2d(3, 1, dilation=(1, 2), ceil_mode=True), 1, 1, 5, 7)],
        "avgpool2d": [layer_case("AvgPool2d(2)", lambda: AvgPool2d(2), 2, 2, 4, 5),
                      layer_case("AvgPool2d(3,stride=2,padding=1)", lambda: AvgPool2d(3, 2, 1), 1, 2, 5, 6),
                      layer_case("AvgPool2d(3,2,1,count_include_pad=False,ceil_mode=True)",
                                 lambda: AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), 1, 2, 6, 6)],
        "flatten": [layer_case("Flatten()", Flatten, 2, 3, 2, 2), layer_case("Flatten(0,1)", lambda: Flatten(0, 1), 2, 3, 4),
                    layer_case("Flatten(-2,-1)", lambda: Flatten(-2, -1), 1, 2, 3, 2)],
        "cnn": [layer_case("CNN(conv,relu,maxpool,conv same,relu,avgpool,flatten,linear)", _small_cnn, 2, 1, 8, 8),
                layer_case("CNN(conv,relu,maxpool,conv same,relu,avgpool,flatten,linear)", _small_cnn, 1, 1, 8, 8)],
    }


def inputs_case(label: str, make: Callable[[], Layer], inputs: Callable[[], tuple], mode: str | None = None,
                **forward_kwargs) -> Case:
    """A check of ``make()`` on the tuple ``inputs()`` (query, key, value; token ids) with keyword arguments."""
    def run(fast: bool) -> list[GradResult]:
        layer = make()
        if mode is not None:
            layer.train(mode == "train")
        args = inputs()
        tag = f" [{mode}]" if mode else ""
        shapes = ",".join(str(tuple(a.shape)) for a in (args if isinstance(args, tuple) else (args,)))
        return check_layer(layer, args, name=f"{label}{tag} x{shapes}", fast=fast, forward_kwargs=forward_kwargs)
    return run


class TextbookAttention:
    """``layers.reference``'s attention_forward/attention_backward as a layer, so that the textbook path is checked
    like the blocked one: forward(q, k, v, attn_mask=None, is_causal=False, dropout_mask=None)."""

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, q, k, v, attn_mask=None, is_causal=False, dropout_mask=None):
        bias = attention_bias(q.shape[-2], k.shape[-2], attn_mask, is_causal, dtype=q.dtype)
        out, self.cache = attention_forward(q, k, v, bias, dropout_mask=dropout_mask)
        return out

    def backward(self, dout):
        return attention_backward(dout, self.cache)

    def parameters(self):
        return []

    def __repr__(self):
        return "TextbookAttention()"


def _attention_cases() -> dict[str, list[Case]]:
    g = torch.Generator().manual_seed(11)
    qkv = lambda lead, L, S, E=4, Ev=3: lambda: (rnd(*lead, L, E), rnd(*lead, S, E), rnd(*lead, S, Ev))  # noqa: E731
    allowed = torch.rand(2, 4, 5, generator=g) > 0.3  # (N, L, S) bool, True = may attend
    allowed[:, :, 0] = True
    row_masked = allowed.clone()
    row_masked[1, 2] = False  # a query that sees no key: zeros and zero gradients, as torch
    bias = torch.randn(4, 5, generator=g, dtype=F64)
    drop = attention_dropout_mask(5, 0.3, 2, 4, 5, dtype=F64)
    sdpa = lambda: ScaledDotProductAttention(block_size=2)  # noqa: E731  (several blocks even at these sizes)
    mha = lambda **kw: lambda: nontrivial_biases(MultiheadAttention(6, 2, dtype=F64, **kw))  # noqa: E731
    kpm = torch.tensor([[False, False, True, True], [False, False, False, False]])  # (N, S) True = padding
    enc = lambda **kw: lambda: nontrivial_biases(TransformerEncoderLayer(4, 2, 6, dtype=F64, **kw))  # noqa: E731
    return {
        "embedding": [inputs_case("Embedding(7,3)", lambda: Embedding(7, 3, dtype=F64),
                                  lambda: torch.tensor([[0, 6, 6, 2], [3, 0, 1, 6]])),
                      inputs_case("Embedding(5,4,padding_idx=1) [ids avoid the padding row]",
                                  lambda: Embedding(5, 4, padding_idx=1, dtype=F64), lambda: torch.tensor([4, 0, 4]))],
        "scaleddotproductattention": [inputs_case("SDPA", sdpa, qkv((2,), 4, 5)),
                      inputs_case("SDPA(causal, L>S)", sdpa, qkv((2,), 6, 4), is_causal=True),
                      inputs_case("SDPA(causal, L<S)", sdpa, qkv((1, 2), 3, 5), is_causal=True),
                      inputs_case("SDPA(bool mask)", sdpa, qkv((2,), 4, 5), attn_mask=allowed),
                      inputs_case("SDPA(bool mask, a fully masked row)", sdpa, qkv((2,), 4, 5), attn_mask=row_masked),
                      inputs_case("SDPA(float mask, scale=0.3)", sdpa, qkv((2,), 4, 5), attn_mask=bias, scale=0.3),
                      inputs_case("SDPA(dropout 0.3)", sdpa, qkv((2,), 4, 5), dropout_p=0.3),
                      inputs_case("SDPA(need_weights, dropout 0.3, causal)", sdpa, qkv((2,), 4, 4), dropout_p=0.3,
                                  is_causal=True, need_weights=True)],
        "attention-textbook": [inputs_case("TextbookAttention", TextbookAttention, qkv((2,), 4, 5)),
                               inputs_case("TextbookAttention(causal)", TextbookAttention, qkv((2,), 5, 5),
                                           is_causal=True),
                               inputs_case("TextbookAttention(bool mask, a fully masked row)", TextbookAttention,
                                           qkv((2,), 4, 5), attn_mask=row_masked),
                               inputs_case("TextbookAttention(float mask, dropout mask)", TextbookAttention,
                                           qkv((2,), 4, 5), attn_mask=bias, dropout_mask=drop)],
        "multiheadattention": [
            inputs_case("MHA(6,2) self", mha(), lambda: (lambda x: (x, x.clone(), x.clone()))(rnd(3, 2, 6))),
            inputs_case("MHA(6,2,add_bias_kv,add_zero_attn) cross, key padding", mha(add_bias_kv=True, add_zero_attn=True),
                        lambda: (rnd(3, 2, 6), rnd(4, 2, 6), rnd(4, 2, 6)), key_padding_mask=kpm),
            inputs_case("MHA(6,2,kdim=3,vdim=5,batch_first) float attn_mask, per-head weights",
                        mha(kdim=3, vdim=5, batch_first=True), lambda: (rnd(2, 3, 6), rnd(2, 4, 3), rnd(2, 4, 5)),
                        attn_mask=torch.randn(3, 4, generator=g, dtype=F64), average_attn_weights=False),
            inputs_case("MHA(6,2) causal hint, no weights", mha(),
                        lambda: (lambda x: (x, x.clone(), x.clone()))(rnd(4, 2, 6)), need_weights=False,
                        attn_mask=torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=F64), is_causal=True),
            inputs_case("MHA(6,2,dropout=0.3) unbatched", mha(dropout=0.3), lambda: (rnd(3, 6), rnd(4, 6), rnd(4, 6)),
                        mode="train")],
        "transformerencoderlayer": [
            inputs_case("TransformerEncoderLayer(4,2,6) post-norm", enc(dropout=0.0), lambda: rnd(3, 2, 4),
                        src_key_padding_mask=kpm[:, :3]),
            inputs_case("TransformerEncoderLayer(4,2,6,gelu) pre-norm, dropout", enc(norm_first=True, activation="gelu",
                                                                                      dropout=0.2),
                        lambda: rnd(3, 2, 4), mode="train")],
        "transformerencoder": [
            inputs_case("TransformerEncoder(2 layers, norm) causal",
                        lambda: nontrivial_biases(TransformerEncoder(TransformerEncoderLayer(4, 2, 6, dropout=0.0,
                                                                                            dtype=F64), 2,
                                                                     norm=LayerNorm(4, dtype=F64))),
                        lambda: rnd(4, 1, 4), mask=torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=F64))],
        "gpt": [inputs_case("GPT(V=7,block=5,L=2,nh=2,C=4,dropout=0.1)",
                            lambda: unit_scale(GPT(vocab_size=7, block_size=5, n_layer=2, n_head=2, n_embd=4,
                                                   dropout=0.1, dtype=F64)),
                            lambda: torch.tensor([[0, 3, 6, 6, 1], [2, 1, 4, 0, 5]]), mode="train")],
        "crossentropyloss-sequence": [
            loss_case("CrossEntropy(ignore_index=0) x(N,C,T)", lambda: CrossEntropyLoss(ignore_index=0), (3, 4, 5),
                      lambda x: torch.randint(0, 4, (3, 5))),
            loss_case("CrossEntropy(ignore_index=-1,smooth=0.1,sum)",
                      lambda: CrossEntropyLoss("sum", label_smoothing=0.1, ignore_index=-1), (6, 5),
                      lambda x: torch.tensor([0, -1, 4, -1, 2, 1]))],
    }


def nontrivial_biases(layer):
    """Biases away from their zero initialisation (a zero bias hides a wrong bias gradient's effect on others)."""
    with torch.no_grad():
        for name, t in layer.named_parameters():
            if "bias" in name.rsplit(".", 1)[-1]:
                t.copy_(torch.randn_like(t) * 0.5)
    return layer


def unit_scale(model):
    """Every parameter drawn at scale ~0.5 (layer-norm gains in [0.5, 1.5]): GPT's N(0, 0.02) initialisation makes
    the early layers' gradients ~1e-5, where central differences' ~1e-10 absolute error is 1e-5 relative."""
    with torch.no_grad():
        for name, t in model.named_parameters():
            is_gain = t.dim() == 1 and "ln" in name and name.endswith("weight")
            t.copy_(torch.rand_like(t) + 0.5 if is_gain else torch.randn_like(t) * 0.5)
    return model


class _TorchOracle:
    """A recurrent layer (RNN, LSTM, GRU, the cells) for check_layer, with torch.nn's kernels as the autograd oracle.

    These layers write into preallocated buffers with out=, which autograd cannot record, and say so
    (``autograd_opaque``).  Under grad mode -- only check_layer's autograd pass -- this runs their torch.nn twin
    instead, ``seeded_dropouts(layer.to_torch())`` (the same dropout masks), with the layer's own parameter tensors
    (in torch's layouts, as views) swapped in by ``torch.func.functional_call``: "vs autograd" is then the
    hand-written backward against autograd through nn.LSTM's (nn.GRU's, ...) own kernels, on the same weights and
    inputs.  Every other call is the layer's.
    """

    def __init__(self, layer):
        self.layer = layer
        self.twin = seeded_dropouts(layer.to_torch())

    def __repr__(self) -> str:
        return repr(self.layer)

    def named_parameters(self):
        return self.layer.named_parameters()

    def parameters(self) -> list[Tensor]:
        return self.layer.parameters()

    def forward(self, x, hx=None):
        if not torch.is_grad_enabled():
            return self.layer.forward(x, hx)
        self.twin.train(self.layer.training)
        # state_dict: torch's layouts (a Linear's weight as (H, D)), views of the layer's own tensors
        return torch.func.functional_call(self.twin, self.layer.state_dict(), (x,) if hx is None else (x, hx))

    def backward(self, *douts):
        return self.layer.backward(*douts)


def recurrent_case(label: str, make: Callable[[], Layer], x_shape: tuple[int, ...],
                   states: tuple | None = None, mode: str | None = None, vocab: int | None = None) -> Case:
    """A check of a recurrent layer or cell on a random input of ``x_shape`` (token ids below ``vocab`` if given)
    and, when ``states`` gives their shapes (a shape, or a pair of shapes for the LSTM's (h_0, c_0)), random
    initial states: their gradients are checked too.  The autograd oracle is the torch.nn twin (``_TorchOracle``)."""
    def run(fast: bool) -> list[GradResult]:
        layer = make()
        if mode is not None:
            layer.train(mode == "train")
        x = rnd(*x_shape) if vocab is None else torch.randint(0, vocab, x_shape)
        if states is None:
            inputs = x
        else:
            hx = tuple(rnd(*s) for s in states) if isinstance(states[0], tuple) else rnd(*states)
            inputs = (x, hx)
        tag = f" [{mode}]" if mode else ""
        where = f" x{x_shape}" + ("" if states is None else f" hx{states}")
        return check_layer(_TorchOracle(layer), inputs, name=f"{label}{tag}{where}", fast=fast)
    return run


def _recurrent_cases() -> dict[str, list[Case]]:
    """Small sizes (T = 3-4, batch 2, hidden 3-5): every entry of every weight is perturbed twice."""
    def make(cls, *a, **kw):
        return lambda: cls(*a, dtype=F64, **kw)
    return {
        "rnn": [recurrent_case("RNN(3,4)", make(RNN, 3, 4), (4, 2, 3)),
                recurrent_case("RNN(3,4,relu,2 layers)", make(RNN, 3, 4, 2, "relu"), (4, 2, 3), (2, 2, 4)),
                recurrent_case("RNN(3,3,bidirectional,batch_first,bias=False)",
                               make(RNN, 3, 3, bias=False, batch_first=True, bidirectional=True), (2, 4, 3), (2, 2, 3)),
                recurrent_case("RNN(3,4) unbatched", make(RNN, 3, 4), (4, 3), (1, 4))],
        "lstm": [recurrent_case("LSTM(3,4)", make(LSTM, 3, 4), (4, 2, 3)),
                 recurrent_case("LSTM(3,3,2 layers,bidirectional)", make(LSTM, 3, 3, 2, bidirectional=True),
                                (3, 2, 3), ((4, 2, 3), (4, 2, 3))),
                 recurrent_case("LSTM(3,4,proj_size=2,batch_first)", make(LSTM, 3, 4, proj_size=2, batch_first=True),
                                (2, 4, 3), ((1, 2, 2), (1, 2, 4))),
                 recurrent_case("LSTM(3,3,2 layers,dropout=0.4)", make(LSTM, 3, 3, 2, dropout=0.4), (3, 2, 3),
                                mode="train"),
                 recurrent_case("LSTM(2,3,proj_size=2,bidirectional) unbatched",
                                make(LSTM, 2, 3, proj_size=2, bidirectional=True), (3, 2), ((2, 2), (2, 3)))],
        "gru": [recurrent_case("GRU(3,4)", make(GRU, 3, 4), (4, 2, 3), (1, 2, 4)),
                recurrent_case("GRU(3,3,2 layers,bidirectional,batch_first)",
                               make(GRU, 3, 3, 2, batch_first=True, bidirectional=True), (2, 3, 3), (4, 2, 3)),
                recurrent_case("GRU(3,4,bias=False) unbatched", make(GRU, 3, 4, bias=False), (4, 3), (1, 4))],
        "rnncell": [recurrent_case("RNNCell(3,4)", make(RNNCell, 3, 4), (2, 3), (2, 4)),
                    recurrent_case("RNNCell(3,4,relu)", make(RNNCell, 3, 4, nonlinearity="relu"), (2, 3)),
                    recurrent_case("RNNCell(3,4) unbatched", make(RNNCell, 3, 4), (3,), (4,))],
        "lstmcell": [recurrent_case("LSTMCell(3,4)", make(LSTMCell, 3, 4), (2, 3), ((2, 4), (2, 4))),
                     recurrent_case("LSTMCell(3,4)", make(LSTMCell, 3, 4), (2, 3)),
                     recurrent_case("LSTMCell(3,4,bias=False) unbatched", make(LSTMCell, 3, 4, bias=False), (3,),
                                    ((4,), (4,)))],
        "grucell": [recurrent_case("GRUCell(3,4)", make(GRUCell, 3, 4), (2, 3), (2, 4)),
                    recurrent_case("GRUCell(3,4) unbatched", make(GRUCell, 3, 4), (3,), (4,))],
        "recurrentlm": [recurrent_case("RecurrentLM(5,3,4,2 layers,lstm,dropout=0.3)",
                                       make(RecurrentLM, 5, 3, 4, 2, dropout=0.3), (2, 3), ((2, 2, 4), (2, 2, 4)),
                                       mode="train", vocab=5),
                        recurrent_case("RecurrentLM(5,3,4,gru)", make(RecurrentLM, 5, 3, 4, cell="gru"), (2, 3),
                                       vocab=5)],
    }


# One function per family of layers; each returns {command-line name: [cases]}.
CASE_FAMILIES: list[Callable[[], dict[str, list[Case]]]] = [
    _mlp_cases,
    _loss_cases,
    _norm_cases,
    _conv_cases,
    _attention_cases,
    _recurrent_cases,
]


def builtin_cases() -> dict[str, list[Case]]:
    """Every built-in layer and loss, on several shapes (including N=1), in float64."""
    cases: dict[str, list[Case]] = {}
    for family in CASE_FAMILIES:
        for key, runs in family().items():
            if key in cases:
                raise ValueError(f"gradcheck: two families define the case {key!r}")
            cases[key] = runs
    return cases


def main(argv: list[str] | None = None) -> int:
    cases = builtin_cases()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layer", metavar="NAME", help=f"check one of: {', '.join(cases)} (case-insensitive)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fast", action="store_true", help="random projections of the Jacobian instead of every entry")
    args = ap.parse_args(argv)
    if args.layer is not None and args.layer.lower() not in cases:
        ap.error(f"unknown layer {args.layer!r}; known: {', '.join(cases)}")
    selected = {k: v for k, v in cases.items() if args.layer is None or k == args.layer.lower()}
    results = []
    # The cases are tiny: one thread.  Convolution and pooling open a parallel region even for an 8x8 image,
    # and on a loaded machine a 2-thread region waits milliseconds for a descheduled thread (7x slower here).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for key, runs in selected.items():
            for i, run in enumerate(runs):
                torch.manual_seed(args.seed + 1000 * list(cases).index(key) + i)  # same inputs with or without --layer
                results += run(args.fast)
    finally:
        torch.set_num_threads(threads)

    w = max(len(r.name) for r in results)
    tw = max(len(r.tensor) for r in results)
    print(f"{'layer':<{w}}  {'tensor':<{tw}} {'max abs diff':>12} {'rel vs numeric':>14} {'rel vs autograd':>15}  result")
    for r in results:
        auto = "opaque" if r.rel_autograd is None else f"{r.rel_autograd:.2e}"
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
