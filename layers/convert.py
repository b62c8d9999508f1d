"""from_torch: a torch.nn model of supported modules becomes its hand-written twin, with the same weights."""
from __future__ import annotations

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
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"from_torch: expected a torch.nn.Module, got {type(module).__name__}")
    if type(module) is nn.Sequential:
        return Sequential(OrderedDict((name, from_torch(child)) for name, child in module.named_children())
                          ).train(module.training)
    table = _supported()
    cls = table.get(type(module))
    if cls is None:
        names = ", ".join(sorted(["Sequential", *(c.__name__ for c in table)]))
        raise TypeError(f"from_torch: {type(module).__name__} is not supported; supported: {names}")
    return cls.from_torch(module)


def to_torch(layer: BaseLayer) -> nn.Module:
    """``layer.to_torch()``: the torch.nn equivalent holding copies of the weights and buffers."""
    convert = getattr(layer, "to_torch", None)
    if convert is None:
        raise TypeError(f"to_torch: {type(layer).__name__} has no torch.nn twin")
    return convert()


__all__ = ["from_torch", "to_torch"]
