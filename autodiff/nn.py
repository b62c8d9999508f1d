"""Neural-network pieces built on the engine: Linear, ReLU, Tanh, Sequential, MLP and the default Net.

Every forward here is ordinary engine arithmetic (``x @ W + b``, ``x.relu()``); the
gradients come from the engine's per-operation closures, not from code in this file.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from models.architecture import CLASSES, DEPTH, HIDDEN, IN_FEATURES, mlp_layers
from layers.init import torch_default_params
from layers.layer import zero_grad_

from .engine import Tensor


class Module:
    """Parameters, zero_grad and a state_dict whose keys and layouts match torch.nn's."""

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        for name, value in vars(self).items():
            if isinstance(value, Tensor) and value.requires_grad:
                yield prefix + name, value
            elif isinstance(value, Module):
                yield from value.named_parameters(f"{prefix}{name}.")
            elif isinstance(value, list):
                for i, m in enumerate(value):
                    if isinstance(m, Module):
                        yield from m.named_parameters(f"{prefix}{name}.{i}.")

    def parameters(self) -> list[Tensor]:
        return [p for _, p in self.named_parameters()]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's .grad (to None by default, as torch does)."""
        zero_grad_((p.data for p in self.parameters()), set_to_none)

    def __call__(self, x):
        return self.forward(x)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """torch tensors in nn.Linear's layout (weights (out, in)), sharing storage with the parameters."""
        return {name: (p.data.t() if name.endswith("weight") else p.data) for name, p in self.named_parameters()}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        own = self.state_dict()
        missing, unexpected = sorted(set(own) - set(state_dict)), sorted(set(state_dict) - set(own))
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for k, dst in own.items():
            if state_dict[k].shape != dst.shape:
                raise ValueError(f"load_state_dict: '{k}' has shape {tuple(state_dict[k].shape)}, "
                                 f"expected {tuple(dst.shape)}")
            with torch.no_grad():
                dst.copy_(state_dict[k])

    def to(self, device=None, dtype=None) -> "Module":
        for p in self.parameters():
            p.data = p.data.to(device=device, dtype=dtype)
        return self


class Linear(Module):
    """out = x @ weight + bias, weight (in, out) laid out in memory as nn.Linear's (out, in); nn.Linear's init."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, device=None, dtype=None):
        w, b = torch_default_params((out_features, in_features), bias, device=device, dtype=dtype)
        self.weight = Tensor(w.t(), requires_grad=True)  # (in, out)
        self.bias = Tensor(b, requires_grad=True) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        out = x @ self.weight  # (N, out)
        return out + self.bias if self.bias is not None else out

    def __repr__(self) -> str:
        return f"Linear({self.weight.shape[0]}, {self.weight.shape[1]})"


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.relu()

    def __repr__(self) -> str:
        return "ReLU()"


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.tanh()

    def __repr__(self) -> str:
        return "Tanh()"


class Sequential(Module):
    def __init__(self, *layers: Module):
        self.layers = list(layers)

    def forward(self, x):
        x = x if isinstance(x, Tensor) else Tensor(x)
        for layer in self.layers:
            x = layer(x)
        return x

    def __repr__(self) -> str:
        return "Sequential(" + ", ".join(map(repr, self.layers)) + ")"


def MLP(sizes: list[int], activation: type[Module] = Tanh, **kw) -> Sequential:
    """MLP([2, 8, 1]): Linear(2, 8), activation, Linear(8, 1)."""
    layers: list[Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(Linear(a, b, **kw))
        if i < len(sizes) - 2:
            layers.append(activation())
    return Sequential(*layers)


class EngineNet(Sequential):
    """The default Net (784 -> [hidden -> ReLU] x depth -> classes) on the engine.

    Same constructor as ``models.Net``; state_dict keys ``layers.{i}.weight`` as in PytorchNet,
    and under the same ``torch.manual_seed`` the same initial weights.  Inputs of rank > 2 are flattened.
    """

    def __init__(self, hidden_size: int = HIDDEN, num_classes: int = CLASSES, in_features: int = IN_FEATURES,
                 depth: int = DEPTH, *, device=None, dtype=None):
        super().__init__(*mlp_layers(Linear, ReLU, hidden_size, num_classes, in_features, depth,
                                     device=device, dtype=dtype))

    def forward(self, x):
        data = x.data if isinstance(x, Tensor) else x
        if data.dim() > 2:
            x = Tensor(data.flatten(1))
        return super().forward(x)
