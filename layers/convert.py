"""from_torch: a torch.nn model of supported modules becomes its hand-written twin, with the same weights."""
from __future__ import annotations

import copy
from collections import OrderedDict

import torch
from torch import nn

from .layer import BaseLayer
from .sequential import Sequential


def _supported() -> dict[type[nn.Module], type[BaseLayer]]:
    """torch.nn class -> hand-written class, for every layer that names its torch twin."""
    table: dict[type[nn.Module], type[BaseLayer]] = {}
    stack = list(BaseLayer.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if cls.__dict__.get("torch_class") is not None and not cls.__name__.startswith("_"):
            table.setdefault(cls.torch_class, cls)
    return table


def from_torch(module: nn.Module) -> BaseLayer:
    """``from_torch(nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), ...))`` -> ``layers.Sequential`` of the
    hand-written layers, holding copies of the module's weights and buffers, in the module's mode.

    nn.Sequential may nest, and keeps its children's names (``nn.Sequential(OrderedDict(fc=...))`` gives
    "fc.weight", so ``to_torch().state_dict()`` loads into the original).  A module with no hand-written twin
    raises a TypeError naming it.

    What torch runs is converted: a module used twice (``act = nn.ReLU(); nn.Sequential(lin, act, lin2, act)``,
    or ``nn.Sequential(lin, nn.Tanh(), lin)``) appears twice, as two hand-written layers that hold the very same
    tensors -- each keeps its own cache for backward, and the shared weight's ``.grad`` receives both uses.
    ``named_parameters()`` then names a shared tensor once, state_dict under every name, as torch's do.  A
    parameter with ``requires_grad=False`` is frozen (``requires_grad_``): it gets no gradient.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"from_torch: expected a torch.nn.Module, got {type(module).__name__}")
    return _convert(module, {})


def _convert(module: nn.Module, converted: dict[int, BaseLayer]) -> BaseLayer:
    """from_torch, with ``converted``: id of each torch module converted so far -> its hand-written layer."""
    done = converted.get(id(module))
    if done is not None:  # the same module used again: the same tensors, a cache of its own
        tensors = [*done.parameters(), *(b for _, b in done.named_buffers())]
        return copy.deepcopy(done, {id(t): t for t in tensors})
    if type(module) is nn.Sequential:
        # module._modules, not named_children(): named_children() gives a module used twice only once
        layer = Sequential(OrderedDict((name, _convert(child, converted)) for name, child in module._modules.items()
                                       if child is not None)).train(module.training)
    else:
        table = _supported()
        cls = table.get(type(module))
        if cls is None:
            names = ", ".join(sorted(["Sequential", *(c.__name__ for c in table)]))
            raise TypeError(f"from_torch: {type(module).__name__} is not supported; supported: {names}")
        layer = cls.from_torch(module)
    converted[id(module)] = layer
    return layer


def to_torch(layer: BaseLayer) -> nn.Module:
    """``layer.to_torch()``: the torch.nn equivalent holding copies of the weights and buffers."""
    convert = getattr(layer, "to_torch", None)
    if convert is None:
        raise TypeError(f"to_torch: {type(layer).__name__} has no torch.nn twin")
    return convert()


__all__ = ["from_torch", "to_torch"]
