"""``--compile fast``: the compiled step without torch.compile's per-call guard evaluation, where that is proven safe.

Before every call of a compiled function torch.compile evaluates the guards its graph was made under: every input
tensor's shape, dtype, device and strides, every Python value the trace read (a hyper-parameter, a flag, whether a
``.grad`` exists), every attribute it looked up.  On a small model's step that is a sizeable share of the call
(docs/benchmarks.md).  ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)`` skips them, and is unsafe: a
change those guards would have caught runs the old graph anyway, silently (an optimizer whose state is created
inside the step restarts its momentum at every call; a new learning rate written as a Python float is ignored).

``GuardFreeStep`` skips them only for a call whose entry state is one the guards have already passed without
compiling anything.  At every call it takes, in Python, a fingerprint of what the step reads and a run can change:

- the arguments: each tensor's shape, dtype, device, strides and ``requires_grad``, every other argument's value;
- every parameter: its identity, ``requires_grad``, and whether its ``.grad`` exists (with the ``.grad``'s shape,
  dtype and strides);
- the optimizer: every hyper-parameter of every group (a tensor by identity, anything else by value) and every
  state tensor (identity, shape, dtype);
- every layer's public plain attributes (``training``, a dropout's ``p``, ...), walking the model's tree;
- torch's global modes the graph depends on (grad mode, the default dtype, deterministic algorithms).

A fingerprint seen before, after a call that ran under the guards and compiled nothing, runs with the guards
skipped; any other runs under the guards (compiling again if the guards say so) and, if it compiled nothing, is
remembered.  The first ``warmup`` calls always run under the guards: the optimizer's state and the ``.grad``
tensors are created there.  What the fingerprint cannot see -- a layer's private attribute changed by hand, a
module-level global -- is not changed by a training run; code that changes such things between steps should use
``--compile`` (every call guarded).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from layers.checks import check_int

from .compiled import _graphs


class GuardFreeStep:
    """``compiled(*args)`` (a torch.compile'd step) with guard evaluation skipped where proven safe (module
    docstring).  ``model``, ``opt``: the handgrad model and optimizer the step trains.  ``guarded`` and ``skipped``
    count the calls of each kind."""

    def __init__(self, compiled: Callable, model, opt, warmup: int = 2):
        check_int("GuardFreeStep", "warmup", warmup)  # >= 1: the optimizer's state is created in the first calls
        self.compiled, self.model, self.opt, self.warmup = compiled, model, opt, warmup
        self.proven: set[tuple] = set()
        self.guarded = self.skipped = 0

    def __call__(self, *args):
        key = fingerprint(args, self.model, self.opt)
        if key in self.proven:
            self.skipped += 1
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return self.compiled(*args)
        self.guarded += 1
        before = _graphs()
        out = self.compiled(*args)
        if self.guarded > self.warmup and _graphs() == before:  # the guards passed an existing graph as it is
            self.proven.add(key)
        return out


def fingerprint(args: tuple, model, opt) -> tuple:
    """What the compiled step reads that a run can change, as one hashable tuple (module docstring)."""
    parts: list = [torch.is_grad_enabled(), torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled()]
    parts.extend(_value(a, same_tensor=False) for a in args)  # a new batch each call: its layout, not its identity
    for p in model.parameters():
        g = p.grad
        parts.append((id(p), p.requires_grad, None if g is None else (g.shape, g.dtype, g.stride())))
    for group in opt.param_groups:
        parts.append(tuple((k, _value(v)) for k, v in group.items() if k != "params"))
    for state in opt.state.values():
        parts.append(tuple((k, _value(v)) for k, v in state.items()))
    stack = [model]
    while stack:
        layer = stack.pop()
        attrs = getattr(layer, "__dict__", {})
        parts.append(
            (
                id(layer),
                tuple(
                    (k, v)
                    for k, v in attrs.items()
                    if not k.startswith("_") and isinstance(v, (bool, int, float, str, type(None)))
                ),
            )
        )
        children = getattr(layer, "named_children", None)
        if children is not None:
            stack.extend(child for _, child in children())
    return tuple(parts)


def _value(v: object, same_tensor: bool = True) -> object:
    """A tensor by its layout (what a guard checks of it) and, with ``same_tensor``, its identity; a tuple element by
    element; anything else by value."""
    if isinstance(v, Tensor):
        return (id(v) if same_tensor else None, v.shape, v.dtype, v.device, v.stride(), v.requires_grad)
    if isinstance(v, (tuple, list)):
        return tuple(_value(x, same_tensor) for x in v)
    return v
