"""The autograd node behind ``as_module``: one ``torch.autograd.Function`` per wrapped layer, whose forward is the
layer's hand-written forward and whose backward is its hand-written backward, re-run from a snapshot when the
layer's cache was used up or overwritten (``HandgradModule`` in ``as_module.py`` holds the snapshot).  A re-run
needs the forward's input and parameters unchanged: one changed in place since (an optimizer step between two
backwards of a retained graph) is refused, as autograd refuses a saved tensor that changed.  Gradients asked for
with create_graph=True come behind a node that refuses a second derivative, naming the layer; forward-mode AD
and vmap are refused by the Function's own ``jvp`` and ``vmap`` rules.

A layer's cache is recognised by the objects its attributes hold right after a forward (``_fingerprint``): a
backward that finds any of them replaced -- by an earlier backward or a later forward -- re-runs the forward first.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch._C._functorch import TransformType
from torch._functorch.eager_transforms import enable_inplace_requires_grad

from ..layer import Layer
from ..saved import versions
from .binding import _named, _plain, bind

_MISSING = object()


class _Seq(tuple):
    """The fingerprint of a tuple or list attribute: its type and its elements' fingerprints."""


def _mark(value: object) -> object:
    """What identifies ``value`` later: a weak reference for a tensor (a strong one to a layer's cached output
    would make a reference cycle through autograd's graph), element by element for a tuple or list, else the
    object itself."""
    if isinstance(value, Tensor):
        return weakref.ref(value)
    if isinstance(value, (tuple, list)):  # a layer's Saved (a NamedTuple) too
        return _Seq((type(value), *map(_mark, value)))
    return value


def _same(value: Any, mark: object) -> bool:
    if isinstance(mark, weakref.ref):
        obj = mark()
        return obj is not None and value is obj
    if isinstance(mark, _Seq):
        return type(value) is mark[0] and len(value) == len(mark) - 1 and all(map(_same, value, mark[1:]))
    return value is mark


def _fingerprint(leaves: list[Layer]) -> list[tuple[Layer, dict]] | None:
    """Every attribute of every layer right after a forward.  The layer's cache is still this forward's as long as
    each attribute is the very same object: a later forward, or a backward (which clears the cache), assigns new
    ones.  (A tensor that died cannot be matched by a new one at its address: its weak reference is dead.)"""
    fp = []
    for node in leaves:
        attrs = getattr(node, "__dict__", None)
        if attrs is None:
            return None  # cannot tell: always re-run
        fp.append((node, {k: _mark(v) for k, v in attrs.items()}))
    return fp


def _unchanged(fp: list[tuple[Layer, dict]] | None) -> bool:
    if fp is None:
        return False
    for node, marks in fp:
        attrs = vars(node)
        if len(attrs) != len(marks) or not all(_same(attrs.get(k, _MISSING), m) for k, m in marks.items()):
            return False
    return True


def _storage_key(t: Tensor) -> int:
    while torch._C._functorch.is_functorch_wrapped_tensor(t):  # under torch.func: the tensor the layer saw
        t = torch._C._functorch.get_unwrapped(t)
    return t.untyped_storage().data_ptr() if t.numel() else -1


def _cached_by(leaves: list[Layer], t: Tensor) -> bool:
    """Whether some layer's cache holds ``t``'s memory (then changing ``t`` in place would corrupt its backward)."""
    key = _storage_key(t)
    if key == -1:
        return False
    for node in leaves:
        for value in vars(node).values():
            items = value if isinstance(value, (tuple, list)) else (value,)
            for v in items:
                if isinstance(v, Tensor) and not isinstance(v, nn.Parameter) and v.numel() and _storage_key(v) == key:
                    return True
    return False


def _placed(e: Exception, where: str) -> Exception:
    """``e`` with ``where`` (the layer, the shapes it was given) in front of its message, the same exception type;
    ``e`` itself where it already says where (a container's message) or its type takes other arguments."""
    if getattr(e, "_handgrad_placed", False):
        return e
    try:
        placed = type(e)(where + str(e))
    except Exception:
        return e
    placed._handgrad_placed = True  # type: ignore[attr-defined]  # a mark of our own on the exception
    return placed


def _second_derivative_refused(layer: Layer, grads: tuple, sources: Sequence[Tensor]) -> tuple:
    """``grads`` behind a node that raises if differentiated (torch's mechanism for a once-differentiable function,
    ``torch.autograd.function.once_differentiable``, with a message that names the layer): create_graph=True alone
    goes on, a backward through these gradients stops in one line.  The node also takes an empty slice of each of
    ``sources`` (the forward's input and parameters, the upstream gradient): every derivative with respect to them
    then passes through it (``autograd.grad(g, x)`` runs only the nodes on a path to x; without these edges it would
    skip the node and call the second derivative zero)."""
    edges = [t.reshape(-1)[:0] for t in sources if isinstance(t, Tensor) and t.requires_grad]
    message = (
        f"as_module({_named(layer)}): its backward is hand-written and gives first derivatives only; a second "
        f"derivative through it (create_graph=True then another backward: a gradient penalty, hvp, hessian) "
        f"is not supported: use its torch.nn twin (layer.to_torch()) there"
    )
    err_fn = torch._C._functions.DelayedError(message.encode(), len(grads) + len(edges))

    def alias(g: Tensor | None) -> Tensor | None:
        return None if g is None else g.detach().requires_grad_()

    out = err_fn(*map(alias, grads), *edges)  # type: ignore[arg-type]  # (None: no gradient, as autograd takes it)
    out = out if isinstance(out, tuple) else (out,)
    return out[: len(grads)]


def _refused_under(layer: Layer, what: str) -> RuntimeError:
    return RuntimeError(
        f"as_module({_named(layer)}): {what} is not supported (its forward and backward are "
        f"hand-written; autograd's backward, torch.func.grad and functional_call are): use its "
        f"torch.nn twin (layer.to_torch()) there"
    )


def _changed(ctx, tensors: tuple[Tensor, ...]) -> str | None:
    """The name of the first of the forward's input and parameters changed in place since the forward, or None."""
    for name, t, then in zip(
        ("its input x", *(f"parameter '{s.name}'" for s in ctx.module._slots)),
        (ctx.x, *tensors),
        ctx.versions,
        strict=True,
    ):
        if then != -1 and t._version != then:
            return name
    return None


def _refuse_transforms(layer: Layer) -> None:
    """Under torch.func, one level of ``grad`` (or ``vjp``) runs the hand-written backward; a second level (a second
    derivative), ``vmap`` and ``jvp`` are refused here, before the forward, naming the case; so are torch.jit.trace
    and torch.export (torch.compile runs it, breaking its graph around the layer)."""
    if torch.jit.is_tracing() or torch.compiler.is_exporting():  # a graph of Python it cannot trace into
        raise _refused_under(layer, "torch.jit.trace" if torch.jit.is_tracing() else "torch.export")
    stack = torch._C._functorch.get_interpreter_stack()
    if not stack:
        return
    keys = [i.key() for i in stack]
    what = None
    if TransformType.Vmap in keys:
        what = "torch.func.vmap (and jacrev, jacfwd, hessian, which vmap)"
    elif TransformType.Jvp in keys:
        what = "forward-mode AD (torch.autograd.forward_ad, torch.func.jvp, jacfwd)"
    elif keys.count(TransformType.Grad) > 1:
        what = "a second derivative (torch.func.grad of torch.func.grad, hessian)"
    if what is not None:
        raise _refused_under(layer, what)


class _HandgradFunction(torch.autograd.Function):
    """apply(module, x, *params) -> module.layer.forward(x) computing with ``params`` (the tensors the module holds
    now, bound into the layer: binding.py); backward: module.layer.backward(dout), the gradients of the
    bound tensors handed to autograd."""

    @staticmethod
    def forward(module, x: Tensor, *params: Tensor) -> Tensor:  # module: as_module.py's HandgradModule
        device = x.device if isinstance(x, Tensor) else torch.device("cpu")
        snapshot = module._snapshot(device)
        with bind(module, list(params), [False] * len(params)):
            out = module.layer.forward(x.clone() if module._inplace else x)
        # The layer holds its own tensors again: what it cached is this forward's as long as each attribute is the
        # very object it is now.
        module._pending = (snapshot, _fingerprint(module._leaves))
        return out.view_as(out) if out is x else out  # (an input returned as-is may not be saved as an output)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: Tensor) -> None:
        module, x, *params = inputs
        # (kept on the module: under torch.func the context of one forward is set up once per transform level)
        ctx.snapshot, ctx.fingerprint = module._pending
        # The output is version-checked at backward only where a layer's cache holds it (an activation's
        # output): a Linear's output may be overwritten in place by an nn.ReLU(inplace=True), as nn.Linear's may.
        saves_out = _cached_by(module._leaves, output)
        ctx.save_for_backward(x, output) if saves_out else ctx.save_for_backward(x)
        ctx.module, ctx.params = module, params
        ctx.x, ctx.versions = x, versions(x, *params)  # a re-run of the forward needs them all unchanged

    @staticmethod
    def jvp(ctx, *tangents):
        raise _refused_under(ctx.module.layer, "forward-mode AD (torch.autograd.forward_ad, torch.func.jvp)")

    @staticmethod
    def vmap(info, in_dims, module, *args):
        raise _refused_under(module.layer, "torch.func.vmap (and jacrev, jacfwd, hessian, which vmap)")

    @staticmethod
    def backward(ctx, dout: Tensor):
        module = ctx.module
        if torch._C._functorch.is_batchedtensor(dout):
            raise _refused_under(module.layer, "torch.func.vmap over its backward (jacrev, vmap of a vjp)")
        if torch._C._functorch.peek_interpreter_stack() is not None:  # torch.func.grad, one level (_refuse_transforms)
            with torch._C._DisableFuncTorch(), enable_inplace_requires_grad(True):
                with torch.no_grad():
                    grads = _backward(ctx, _plain(dout))
                sources = [_plain(t) for t in (ctx.saved_tensors[0], *ctx.params, dout)]
                if any(t.requires_grad for t in sources):  # plain autograd around torch.func.grad may go on
                    return _second_derivative_refused(module.layer, grads, sources)
                return grads
        with torch.no_grad():
            grads = _backward(ctx, dout)
        if torch.is_grad_enabled():  # create_graph=True: these gradients may be differentiated again
            return _second_derivative_refused(module.layer, grads, (ctx.saved_tensors[0], *ctx.params, dout))
        return grads


def _backward(ctx, dout: Tensor) -> tuple:
    module = ctx.module  # the HandgradModule (as_module.py) that holds the layer and its snapshot
    layer, slots = module.layer, module._slots
    try:
        x = ctx.saved_tensors[0]  # torch's version check of the input (and of a cached output)
    except RuntimeError as e:
        if "modified by an inplace operation" not in str(e):
            raise
        raise RuntimeError(
            f"as_module({_named(layer)}): the input of its forward (or its output, which the "
            f"backward reads) was modified by an inplace operation before this backward; {e}"
        ) from e
    params = ctx.params
    rerun = not _unchanged(ctx.fingerprint)  # this forward's cache is gone (used by a backward, or overwritten)
    if rerun:
        changed = _changed(ctx, params)
        if changed is not None:
            raise RuntimeError(
                f"as_module({_named(layer)}): {changed} was modified by an inplace operation (an optimizer step?) "
                f"after the forward of the graph this backward runs through, and the layer's cache of that forward "
                f"is gone (an earlier backward used it): the gradient would come from the new values; call every "
                f"backward of a graph before changing its tensors in place, or run the forward again"
            )
    ctx.fingerprint = None  # the backward below consumes the cache: a later backward re-runs the forward
    need_dx = ctx.needs_input_grad[1]
    needs = ctx.needs_input_grad[2:]
    with bind(module, list(params), needs) as held:
        if rerun:
            module._rerun(x, ctx.snapshot)
        dout = dout.contiguous()
        try:
            if module._skips_dx:
                dx = layer.backward(dout, need_input_grad=need_dx)
            else:
                dx = layer.backward(dout)
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            placed = _placed(
                e,
                f"as_module({_named(layer)}): its backward failed, given dout of shape "
                f"{tuple(dout.shape)} (the shape of its output): ",
            )
            if placed is e:
                raise
            raise placed from e
        grads = [t.grad for t in held]
    if need_dx and not (isinstance(dx, Tensor) and dx.shape == x.shape):
        got = f"shape {tuple(dx.shape)}" if isinstance(dx, Tensor) else type(dx).__name__
        raise ValueError(
            f"as_module({_named(layer)}): its backward returned dx of {got}, but its input had shape {tuple(x.shape)}"
        )
    for s, g in zip(slots, grads, strict=True):
        if g is not None and g.shape != s.param.shape:
            raise ValueError(
                f"as_module({_named(layer)}): its backward left a gradient of shape {tuple(g.shape)} in "
                f"'{s.name}'.grad, but the parameter has shape {tuple(s.param.shape)}"
            )
    grads = [g if need else None for g, need in zip(grads, needs, strict=True)]
    return (None, dx if need_dx else None, *grads)
