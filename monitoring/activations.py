"""Forward hooks that gather per-layer output statistics (mean, std, dead ReLUs, saturated tanh/sigmoid).

Two kinds of model: a hand-written ``layers.Sequential``/``Net`` (hooks registered with
``Sequential.register_forward_hook`` on every container of the tree) and a ``torch.nn.Module``
(``Module.register_forward_hook`` on every leaf module).  Nothing is registered until ``attach``:
a model that is not watched runs its usual forward.  The statistics of each forward stay on the
device (``latest``) until the monitor reads them back with the rest of an update.  Forwards in eval
mode (evaluation between steps) are skipped unless ``in_eval=True``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .stats import activation_stats

_KINDS = {"ReLU": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid"}


def activation_kind(layer) -> str | None:
    """ "relu", "tanh", "sigmoid" for handgrad's and torch.nn's ReLU/Tanh/Sigmoid layers, else None."""
    import layers

    for name, kind in _KINDS.items():
        if isinstance(layer, (getattr(layers, name), getattr(torch.nn, name))):
            return kind
    return None


def _handgrad_containers(model) -> list[tuple[str, object]]:
    """Every Sequential in a hand-written model's tree, with its dotted prefix ("" for the model itself)."""
    from layers import Sequential

    found, stack = [], [("", model)]
    while stack:
        prefix, node = stack.pop()
        found.append((prefix, node))
        for cname, child in node.named_children():
            if isinstance(child, Sequential):
                stack.append((f"{prefix}{cname}.", child))
    return found


class ActivationWatcher:
    """Per-layer output statistics of the latest forward: ``latest`` maps a layer's dotted name (torch's,
    e.g. "layers.1") to (layer type, kind, float64 (3,) device tensor of mean, std, dead/saturated fraction)."""

    def __init__(self, model, in_eval: bool = False) -> None:
        from layers import Sequential

        self.in_eval = in_eval
        self.active = True  # the monitor turns gathering off for forwards whose step it will not record
        self.latest: dict[str, tuple[str, str | None, Tensor]] = {}
        self._handles: list = []
        if isinstance(model, Sequential):
            for prefix, container in _handgrad_containers(model):
                names = {id(child): f"{prefix}{cname}" for cname, child in container.named_children()}
                self._handles.append(container.register_forward_hook(self._handgrad_hook(names)))
        elif isinstance(model, torch.nn.Module):
            for name, module in model.named_modules():
                if next(module.children(), None) is None:  # a leaf: containers' outputs are their last child's
                    self._handles.append(module.register_forward_hook(self._torch_hook(name or type(module).__name__)))
        else:
            raise TypeError(
                f"activation statistics need a hand-written layers.Sequential/Net or a torch.nn.Module, "
                f"got {type(model).__name__} (the autodiff engine's models have no forward hooks)"
            )

    def _handgrad_hook(self, names: dict[int, str]):
        from layers import Sequential

        def hook(layer, out: Tensor) -> None:
            if not isinstance(layer, Sequential):  # a nested container's children report for it
                self._record(names[id(layer)], layer, out)

        return hook

    def _torch_hook(self, name: str):
        def hook(module, inputs, out) -> None:
            if isinstance(out, Tensor):
                self._record(name, module, out)

        return hook

    def _record(self, name: str, layer, out: Tensor) -> None:
        if not self.active or not (self.in_eval or getattr(layer, "training", True)):
            return
        if out.numel() == 0 or not out.is_floating_point():
            return
        kind = activation_kind(layer)
        with torch.no_grad():
            self.latest[name] = (type(layer).__name__, kind, activation_stats(out, kind))

    def take(self) -> dict[str, tuple[str, str | None, Tensor]]:
        """The statistics gathered since the last ``take``, in forward order; clears them."""
        latest, self.latest = self.latest, {}
        return latest

    def remove(self) -> None:
        """Unregister every hook: the model's forward is as it was before ``attach``."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.latest.clear()
