"""The autograd node behind ``as_module``: one ``torch.autograd.Function`` per wrapped layer, whose forward is the
layer's hand-written forward and whose backward is its hand-written backward, re-run from a snapshot when the
layer's cache was used up or overwritten (``HandgradModule`` in ``as_module.py`` holds the snapshot).

A layer's cache is recognised by the objects its attributes hold right after a forward (``_fingerprint``): a
backward that finds any of them replaced -- by an earlier backward or a later forward -- re-runs the forward first.
"""
from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

from .layer import Layer

_MISSING = object()


class _Seq(tuple):
    """The fingerprint of a tuple or list attribute: its type and its elements' fingerprints."""


def _mark(value: object) -> object:
    """What identifies ``value`` later: a weak reference for a tensor (a strong one to a layer's cached output
    would make a reference cycle through autograd's graph), element by element for a tuple or list, else the
    object itself."""
    if isinstance(value, Tensor):
        return weakref.ref(value)
    if type(value) in (tuple, list):
        return _Seq((type(value), *map(_mark, value)))
    return value


def _same(value: object, mark: object) -> bool:
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
                if isinstance(v, Tensor) and not isinstance(v, nn.Parameter) and v.numel() \
                        and _storage_key(v) == key:
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
    placed._handgrad_placed = True
    return placed


class _HandgradFunction(torch.autograd.Function):
    """apply(module, x, *params) -> module.layer.forward(x); backward: module.layer.backward(dout)."""

    @staticmethod
    def forward(ctx, module: "HandgradModule", x: Tensor, *params: Tensor) -> Tensor:
        device = x.device if isinstance(x, Tensor) else torch.device("cpu")
        snapshot = module._snapshot(device)
        out = module.layer.forward(x.clone() if module._inplace else x)
        # The output is version-checked at backward only where a layer's cache holds it (an activation's
        # output): a Linear's output may be overwritten in place by an nn.ReLU(inplace=True), as nn.Linear's may.
        saves_out = _cached_by(module._leaves, out)
        ctx.save_for_backward(x, out) if saves_out else ctx.save_for_backward(x)
        ctx.module, ctx.snapshot, ctx.fingerprint = module, snapshot, _fingerprint(module._leaves)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout: Tensor):
        module = ctx.module  # the HandgradModule (as_module.py) that holds the layer and its snapshot
        layer, slots = module.layer, module._slots
        x = ctx.saved_tensors[0]  # raises torch's "modified by an inplace operation" error where it applies
        if not _unchanged(ctx.fingerprint):
            module._rerun(x, ctx.snapshot)  # this forward's cache is gone: rebuild it
        ctx.fingerprint = None  # the backward below consumes the cache: a later backward re-runs the forward
        need_dx = ctx.needs_input_grad[1]
        stash = [s.tensor.grad for s in slots]  # the layer's own .grads stay as they were
        for s in slots:
            s.tensor.grad = None
        try:
            dout = dout.contiguous()
            try:
                if module._skips_dx:
                    dx = layer.backward(dout, need_input_grad=need_dx)
                else:
                    dx = layer.backward(dout)
            except (RuntimeError, ValueError, TypeError, IndexError) as e:
                placed = _placed(e, f"as_module({layer!r}): its backward failed, given dout of shape "
                                    f"{tuple(dout.shape)} (the shape of its output): ")
                if placed is e:
                    raise
                raise placed from e
            grads = [s.tensor.grad for s in slots]
        finally:
            for s, g in zip(slots, stash):
                s.tensor.grad = g
        if need_dx and not (isinstance(dx, Tensor) and dx.shape == x.shape):
            got = f"shape {tuple(dx.shape)}" if isinstance(dx, Tensor) else type(dx).__name__
            raise ValueError(f"as_module({layer!r}): its backward returned dx of {got}, but its input had shape "
                             f"{tuple(x.shape)}")
        for s, g in zip(slots, grads):
            if g is not None and g.shape != s.param.shape:
                raise ValueError(f"as_module({layer!r}): its backward left a gradient of shape {tuple(g.shape)} in "
                                 f"'{s.name}'.grad, but the parameter has shape {tuple(s.param.shape)}")
        grads = [g if need else None for g, need in zip(grads, ctx.needs_input_grad[2:])]
        return (None, dx if need_dx else None, *grads)
