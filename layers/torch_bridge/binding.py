"""Which tensors ``as_module``'s layer computes with: the ones torch would use, read from the module at each call.

torch.nn's idioms change what ``getattr(module, "weight")`` gives without touching the tensor the layer was built
over: ``torch.func.functional_call`` swaps in other tensors for one call (MAML's fast weights), a parametrization
computes the weight from ``parametrizations.weight.original`` (``weight_norm``, ``spectral_norm``,
``register_parametrization``), pruning makes it ``weight_orig * weight_mask``, and ``module.weight =
nn.Parameter(...)`` registers another Parameter in its place.  So at each call the wrapper reads every parameter
from the submodule that registers it (``read_parameters``), passes what it read into the autograd Function as an
input (autograd sends the gradient on to whatever the tensor came from), and binds a detached alias of each into
the layer for that forward and again for its backward (``bind``): the hand-written layer computes with the
tensors torch would use, and writes its gradients into the aliases, not into its own tensors.

An alias's ``requires_grad`` is autograd's answer for that input (``ctx.needs_input_grad``), and a layer's own
freezing set is the same answer while it is bound: whether a parameter gets a gradient is the flag of the tensor the
module holds, as torch decides it, whichever way the layer's own tensors are flagged.

Buffers (batch norm's running statistics) are updated in place by the layer's forward: a buffer replaced on
the module (``functional_call`` with buffers, an assignment) is refused, in one line.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import prune
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

_ABSENT = object()


_RECOMPUTES = (prune.BasePruningMethod, WeightNorm, SpectralNorm)  # pre-hooks that recompute a parameter


def run_pruning_hooks(module: nn.Module, holders: list[nn.Module], x: Tensor) -> None:
    """The pre-hooks that recompute a parameter (pruning's ``weight = weight_orig * weight_mask``, the hook forms of
    weight_norm and spectral_norm) on the submodules that only hold parameters: nothing calls those submodules, so
    the wrapper runs them, as an nn.Linear's own call would.  Any other hook there is refused: it could never run."""
    for sub in holders:
        for hook in sub._forward_pre_hooks.values():
            if isinstance(hook, _RECOMPUTES):
                hook(sub, (x,))
            else:
                _refuse_hook(module, sub, "forward pre-hook")
        for kind, hooks in (
            ("forward hook", sub._forward_hooks),
            ("backward hook", sub._backward_hooks),
            ("backward pre-hook", sub._backward_pre_hooks),
        ):
            if hooks:
                _refuse_hook(module, sub, kind)


def _refuse_hook(module: nn.Module, sub: nn.Module, kind: str) -> None:
    name = next(n for n, m in module.named_modules() if m is sub)
    raise RuntimeError(
        f"{where(module)}: a {kind} on its submodule '{name}' would never run (as_module's "
        f"submodules only hold parameters; the hand-written layer runs as one autograd node): "
        f"register the hook on the as_module wrapper itself"
    )


def read_parameters(module: Any) -> list[Tensor]:  # module: as_module.py's HandgradModule
    """The tensor torch would use for each parameter now, in slot order: ``getattr(holder, name)``."""
    tensors = []
    for s in module._slots:
        (first, attr), *others = s.holders
        t = getattr(first, attr)
        if any(getattr(sub, name) is not t for sub, name in others):  # a tied parameter: one tensor for every name
            raise RuntimeError(
                f"{where(module)}: parameter '{s.name}' is tied (one tensor under several names), but "
                f"its names now give different tensors, and the hand-written layer uses one for all: "
                f"give every name the same tensor"
            )
        if not isinstance(t, Tensor) or t.shape != s.param.shape:
            got = f"shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
            raise RuntimeError(
                f"{where(module)}: parameter '{s.name}' is now {got}, the layer's is "
                f"{tuple(s.param.shape)}: the hand-written layer computes in its own layout"
            )
        if t is not s.param and not s.bindable:
            raise RuntimeError(
                f"{where(module)}: parameter '{s.name}' was replaced, but {type(s.node).__name__} "
                f"holds it under no attribute the wrapper can set for one call: assign new values in "
                f"place (with torch.no_grad(): p.copy_(...)) or give the layer a named attribute"
            )
        tensors.append(t)
    for sub, attr, t in module._buffer_holders:
        if sub._buffers.get(attr, _ABSENT) is not t:
            prefix = next(n for n, m in module.named_modules() if m is sub)
            name = f"{prefix}.{attr}" if prefix else attr
            raise RuntimeError(
                f"{where(module)}: buffer '{name}' was replaced (functional_call with buffers, or an "
                f"assignment), but the hand-written layer updates its own buffers in place: load "
                f"values with module.load_state_dict or copy_ them in"
            )
    return tensors


def where(module: nn.Module) -> str:
    """``as_module(<the layer in one line>)``, how a message names the wrapper."""
    return f"as_module({_named(module.layer)})"


def _named(layer: object) -> str:
    """The layer in one line: its repr, or for a container its class and its children's classes."""
    text = repr(layer)
    if "\n" not in text:
        return text
    children = getattr(layer, "named_children", None)
    inner = ", ".join(type(c).__name__ for _, c in children()) if children is not None else "..."
    return f"{type(layer).__name__}({inner})"


def rewired(module: Any) -> str | None:  # module: a HandgradModule
    """The first parameter the module no longer registers as it was built (parametrized, pruned, replaced), or None."""
    for s in module._slots:
        for sub, attr in s.holders:
            if sub._parameters.get(attr) is not s.param:
                return s.name
    return None


def _plain(t: Tensor) -> Tensor:
    """The tensor under torch.func's wrappers (what the hand-written layer computes with under torch.func.grad)."""
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


@contextmanager
def bind(module: Any, tensors: list[Tensor], needs: Sequence[bool]) -> Iterator[list[Tensor]]:  # a HandgradModule
    """The layer holds a detached alias of each tensor (``requires_grad`` = ``needs``) while the block runs; yields
    the tensors the layer holds, whose ``.grad`` the layer's backward writes.  Its own tensors come back after."""
    held, undo = [], []
    try:
        for s, t, need in zip(module._slots, tensors, needs, strict=True):
            if not s.bindable:  # the layer's own tensor (read_parameters refused anything else): its .grad stashed
                undo.append((s.tensor, "grad", s.tensor.grad))
                s.tensor.grad = None
                held.append(s.tensor)
                continue
            alias = _plain(t).detach()
            alias.requires_grad_(need)
            for node, attr in s.users:  # a tensor two layers share: one alias, both gradients into its .grad
                undo.append((node, attr, vars(node).get(attr, _ABSENT)))
                setattr(node, attr, alias)
            held.append(alias)
        yield held
    finally:
        for obj, attr, value in reversed(undo):
            if value is _ABSENT:
                delattr(obj, attr)
            else:
                setattr(obj, attr, value)
