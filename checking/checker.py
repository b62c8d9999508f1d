"""The gradient checker: hand-written backward passes checked twice, against central differences and against
torch.autograd.

``check_layer(layer, x)`` / ``check_loss(loss_fn, input, target)`` return one ``GradResult`` per checked
tensor (the input and every parameter); ``python gradcheck.py`` runs them on every built-in layer and loss.
Everything runs in float64; ``numeric.py`` beside this file has the central differences and the relative error.

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

import contextlib
import inspect
from collections.abc import Callable

import torch
import torch.utils._pytree
from torch import Tensor

from layers.checks import check_bool, check_int, check_number
from layers.layer import Layer, named_parameters_of, recording_graph
from layers.template import Template

from .numeric import EPS, RTOL, GradResult, fast_result, full_result, numeric_grad, rel_error


def _check_settings(eps: object, rtol: object) -> None:
    """eps and rtol: positive finite numbers (a bool is not one)."""
    check_number("gradcheck", "eps", eps, 0.0, lo_open=True)
    check_number("gradcheck", "rtol", rtol, 0.0, lo_open=True)


def _require_float64(owner: str, tensors: dict[str, Tensor]) -> None:
    for name, t in tensors.items():
        if t.dtype != torch.float64:
            raise ValueError(
                f"gradcheck {owner}: {name} has dtype {t.dtype}; gradient checks need float64 "
                f"(use .to(dtype=torch.float64) / .double())"
            )


def _autograd(
    owner: str, fn: Callable[[], Tensor | tuple], leaves: list[Tensor], dout: Tensor | None, *, opaque: bool
) -> list[Tensor] | None:
    """Gradients of fn() (contracted with dout) w.r.t. leaves by torch.autograd.  ``fn`` may instead return
    (outputs, their upstream gradients), two lists.

    None only for a layer that declared itself opaque to autograd; for any other, a forward that autograd
    cannot trace is an error (counted as a pass, a crash would print PASS).
    """
    if opaque:
        return None
    flags = [t.requires_grad for t in leaves]  # a layer's parameters require gradients already: put back as found
    try:
        with torch.enable_grad(), recording_graph():  # the hand-written forward, recorded by autograd this once
            for t in leaves:
                t.requires_grad_(True)
            out = fn()
            outs, douts = out if isinstance(out, tuple) else ([out], [dout])
            if not any(o.requires_grad for o in outs):
                raise RuntimeError("the output does not depend on any input through operations autograd records")
            outs, douts = zip(*[(o, d) for o, d in zip(outs, douts, strict=True) if o.requires_grad], strict=True)
            grads = torch.autograd.grad(outs, leaves, douts, allow_unused=True)
    except RuntimeError as e:
        raise RuntimeError(
            f"gradcheck {owner}: torch.autograd could not differentiate the forward ({e}); a layer "
            f"whose forward autograd cannot trace must set autograd_opaque = True"
        ) from e
    finally:
        for t, flag in zip(leaves, flags, strict=True):
            t.requires_grad_(flag)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads, strict=True)]


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
        forward = layer.forward_math if isinstance(layer, Template) else layer.forward  # (the math names them)
        params = [
            p.name
            for p in inspect.signature(forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
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


def check_layer(
    layer: Layer,
    x: Tensor | tuple,
    dout: Tensor | tuple | None = None,
    *,
    eps: float = EPS,
    rtol: float = RTOL,
    name: str | None = None,
    seed: int = 0,
    fast: bool = False,
    forward_kwargs: dict | None = None,
) -> list[GradResult]:
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
        raise TypeError(
            f"gradcheck: check_layer needs a layer, an object with forward(x) and backward(dout) "
            f"methods (and parameters() if it has any), got {type(layer).__name__} {layer!r:.60}; "
            f"a plain function has no hand-written backward to check"
        )
    _check_settings(eps, rtol)
    check_bool("gradcheck", "fast", fast)
    check_int("gradcheck", "seed", seed, lo=0)
    owner = name or repr(layer).split("\n")[0]
    kwargs = forward_kwargs or {}
    multi = isinstance(x, tuple)
    args = x if multi else (x,)
    args = torch.utils._pytree.tree_map(lambda t: t.detach().clone() if _checked(t) else t, args)  # ours to perturb
    in_leaves, in_spec = torch.utils._pytree.tree_flatten(args)
    in_names = [
        n
        for arg_name, arg in zip(_input_names(layer, len(args)), args, strict=True)
        for n, _ in _leaf_names(arg_name, arg)
    ]
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
    flags = [p.requires_grad for _, p in params]  # a frozen parameter is checked too: unfrozen for the check

    def run_backward(douts: list) -> object:
        """layer.backward on copies of ``douts`` (each one's change in place is reported); a failure inside it is
        re-raised naming the layer and the shapes it was given and should give back."""
        copies = [None if d is None else d.clone() for d in douts]
        dargs = torch.utils._pytree.tree_unflatten(copies, out_spec)
        dargs = dargs if isinstance(dargs, tuple) else (dargs,)
        try:
            grads = layer.backward(*dargs, need_input_grad=True) if asks_dx else layer.backward(*dargs)
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            raise _placed(
                e,
                f"gradcheck {owner}: {type(layer).__name__}.backward failed, "
                f"{_backward_shapes(douts, in_names, in_leaves, checked, params)}: ",
            ) from e
        for i, (d, c) in enumerate(zip(douts, copies, strict=True)):
            if d is not None and not torch.equal(d, c):
                changed[f"dout[{i}]" if len(douts) > 1 else "dout"] = (c - d).abs().max().item()
        return grads

    changed: dict[str, float] = {}  # dout name -> the largest change backward made to it in place
    try:
        for _, p in params:
            p.requires_grad_(True)
        with torch.no_grad():
            out = forward(in_leaves)
        out_leaves, out_spec = torch.utils._pytree.tree_flatten(out)
        if dout is None:
            g = torch.Generator(device="cpu").manual_seed(seed)
            douts = [
                torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device) if t is not None else None
                for t in outputs(out)
            ]
        else:
            douts = (
                torch.utils._pytree.tree_leaves(dout, is_leaf=lambda t: t is None)
                if isinstance(dout, tuple)
                else [dout]
            )
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
            raise TypeError(
                f"gradcheck {owner}: backward returned {len(grad_leaves)} gradients for "
                f"{len(in_leaves)} inputs ({', '.join(in_names)}), in the inputs' structure"
            )
        hand = {}
        for i, (n, g) in enumerate(zip(in_names, grad_leaves, strict=True)):
            if i in checked and not isinstance(g, Tensor):
                raise TypeError(
                    f"gradcheck {owner}: backward returned {type(g).__name__} for input {n}, not its gradient"
                )
            if i not in checked and g is not None:
                raise TypeError(
                    f"gradcheck {owner}: backward returned a gradient for {n}, which has none "
                    f"(not a floating-point tensor): return None there"
                )
            if i in checked:
                hand[n] = g
        hand.update({n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in params})
        received = {n for n, p in params if p.grad is not None}

        # Again, on .grads that already hold something (of the gradient's size, so that adding loses no digits of
        # a small gradient): backward must add to them.
        g = torch.Generator(device="cpu").manual_seed(seed + 3)
        before = {
            n: torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device) * (hand[n].abs().max().item() or 1.0)
            for n, p in params
        }
        for n, p in params:
            p.grad = before[n].clone()
        with torch.no_grad():
            forward(in_leaves)
            run_backward(douts)
        problems = {n: _accumulation_problem(n, p.grad, before[n], hand[n], rtol) for n, p in params if n in received}
        if changed:
            first = next(iter(tensors))
            problems[first] = "; ".join(p for p in (problems.get(first), _dout_problem(changed)) if p)
        for _, p in params:
            p.grad = None

        auto_leaves = [t.clone() if i in checked else t for i, t in enumerate(in_leaves)]
        auto_inputs = [auto_leaves[i] for i in checked]

        def auto_fn() -> tuple[list[Tensor], list[Tensor]]:
            outs = outputs(forward(auto_leaves))
            kept = [(o, d) for o, d in zip(outs, douts, strict=True) if o is not None and d is not None]
            return [o for o, _ in kept], [d for _, d in kept]

        auto_list = _autograd(owner, auto_fn, auto_inputs + [p for _, p in params], None, opaque=opaque)
        auto = dict.fromkeys(tensors) if auto_list is None else dict(zip(tensors, auto_list, strict=True))

        def f() -> float:
            with torch.no_grad():
                outs = outputs(forward(in_leaves))
                return sum(
                    (o * d).sum().item() for o, d in zip(outs, douts, strict=True) if o is not None and d is not None
                )

        if fast:
            results = [
                fast_result(owner, n, hand[n], f, t, auto[n], rtol, eps, seed + 7 + i)
                for i, (n, t) in enumerate(tensors.items())
            ]
        else:
            results = [
                full_result(owner, n, hand[n], numeric_grad(f, t, eps), auto[n], rtol) for n, t in tensors.items()
            ]
        for r in results:
            r.problem = problems.get(r.tensor)
        return results
    finally:
        for (_, p), gsave, flag in zip(params, saved, flags, strict=True):
            p.grad = gsave
            p.requires_grad_(flag)
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
        return (
            f"backward overwrites {name}.grad instead of adding to it: a reused layer or accumulated "
            f"micro-batches lose all but the last gradient; write {name}.grad += ... (or "
            f"{name}.grad = {name}.grad + ... where it may be None), not {name}.grad = ..."
        )
    return (
        f"backward does not add its gradient to what {name}.grad held (with .grad pre-filled, .grad after minus "
        f"before is {rel_error(after - before, grad):.2e} from the gradient it gives from an empty .grad)"
    )


def _dout_problem(changed: dict[str, float]) -> str:
    names = ", ".join(f"{n} (by up to {v:.3g})" for n, v in changed.items())
    return (
        f"backward changed its upstream gradient {names} in place: in a network the layer before it would "
        f"receive changed values; compute into a new tensor (dout * mask, not dout.mul_(mask) or dout[...] = 0)"
    )


def _backward_shapes(
    douts: list, in_names: list[str], in_leaves: list, checked: list[int], params: list[tuple[str, Tensor]]
) -> str:
    """ "given dout of shape (2, 5) (its output's); it should return dx of shape (2, 3) and leave weight.grad (5, 3),
    bias.grad (5,)": what check_layer handed a backward and what it expects back."""
    given = [tuple(d.shape) for d in douts if d is not None]
    given_text = (
        f"given dout of shape {given[0]}" if len(given) == 1 else f"given douts of shapes {', '.join(map(str, given))}"
    ) + " (the shape of its output)"
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


def check_loss(
    loss_fn, input: Tensor, target: Tensor, *, eps: float = EPS, rtol: float = RTOL, name: str | None = None
) -> list[GradResult]:
    """Check ``loss_fn.backward()`` (dL/dinput) for a loss with the ``crit(input, target)`` interface."""
    _check_settings(eps, rtol)
    owner = name or repr(loss_fn)
    x = input.detach().clone()
    _require_float64(owner, {"input": x})
    with torch.no_grad():
        loss_fn(x, target)
        hand = loss_fn.backward()
    xa = x.clone()
    auto_list = _autograd(
        owner, lambda: loss_fn(xa, target), [xa], None, opaque=bool(getattr(loss_fn, "autograd_opaque", False))
    )

    def f() -> float:
        with torch.no_grad():
            return loss_fn(x, target).item()

    return [
        full_result(owner, "input", hand, numeric_grad(f, x, eps), None if auto_list is None else auto_list[0], rtol)
    ]
