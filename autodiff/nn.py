"""Neural-network pieces built on the engine: Linear, ReLU, Tanh, Sequential, MLP and the default Net.

Every forward here is ordinary engine arithmetic (``x @ W.T + b``, ``x.relu()``); the
gradients come from the engine's per-operation closures, not from code in this file.
Every parameter has torch.nn's name, shape and layout (a Linear's weight is (out_features,
in_features), as nn.Linear's), so ``named_parameters()``, each ``.grad``, an optimizer's state
and ``state_dict()`` pair with the nn.Module twin's by name and by position.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

import torch

from layers.init import torch_default_params
from layers.layer import zero_grad_
from models.architecture import CLASSES, DEPTH, HIDDEN, IN_FEATURES, mlp_layers

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
        """The parameters' torch tensors under torch.nn's names (the tensors themselves, not copies)."""
        return {name: p.data for name, p in self.named_parameters()}

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        own = self.state_dict()
        missing, unexpected = sorted(set(own) - set(state_dict)), sorted(set(state_dict) - set(own))
        if missing or unexpected:
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for k, dst in own.items():
            if state_dict[k].shape != dst.shape:
                raise ValueError(
                    f"load_state_dict: '{k}' has shape {tuple(state_dict[k].shape)}, expected {tuple(dst.shape)}"
                )
            with torch.no_grad():
                dst.copy_(state_dict[k])

    def to(self, device=None, dtype=None) -> Module:
        """Move and/or convert every parameter in place: ``to(torch.float64)``, ``to("cuda")``,
        ``to(device=..., dtype=...)``.

        As nn.Module.to does, each parameter keeps its torch tensor (only that tensor's ``.data`` is replaced), so
        an optimizer built before still holds the tensors that backward fills.  (Its state, once it has stepped,
        keeps the old dtype and device, as torch.optim's does: build the optimizer after ``to``.)
        """
        if isinstance(device, torch.dtype):  # to(torch.float64)
            device, dtype = None, device
        if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError(
                f"{type(self).__name__}.to: parameters must stay floating-point (they take gradients), "
                f"got dtype {dtype}; convert the input instead"
            )
        for p in self.parameters():
            t = p.data
            t.data = t.data.to(device=device, dtype=dtype)
            if t.grad is not None:
                t.grad = t.grad.to(device=device, dtype=dtype)
        return self


class Linear(Module):
    """out = x @ weight.T + bias, weight (out_features, in_features) as nn.Linear's; nn.Linear's init.

    (CS231n writes the same layer as x @ W + b with W (in, out): that W is this weight's transpose.)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, device=None, dtype=None):
        w, b = torch_default_params((out_features, in_features), bias, device=device, dtype=dtype)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Tensor(w, requires_grad=True)  # (out, in)
        self.bias = Tensor(b, requires_grad=True) if bias else None  # (out,)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"{self!r}: input has shape {tuple(x.shape)}, expected (N, {self.in_features}): its "
                f"last dimension must be in_features={self.in_features}"
            )
        out = x @ self.weight.T  # (N, in) @ (in, out) -> (N, out)
        return out + self.bias if self.bias is not None else out

    def __repr__(self) -> str:
        return f"Linear({self.in_features}, {self.out_features})"


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
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(Linear(a, b, **kw))
        if i < len(sizes) - 2:
            layers.append(activation())
    return Sequential(*layers)


class EngineNet(Sequential):
    """The default Net (784 -> [hidden -> ReLU] x depth -> classes) on the engine.

    Same constructor as ``models.Net``; state_dict keys ``layers.{i}.weight`` as in PytorchNet,
    and under the same ``torch.manual_seed`` the same initial weights.  Inputs of rank > 2 are flattened.
    """

    def __init__(
        self,
        hidden_size: int = HIDDEN,
        num_classes: int = CLASSES,
        in_features: int = IN_FEATURES,
        depth: int = DEPTH,
        *,
        device=None,
        dtype=None,
    ):
        super().__init__(
            *mlp_layers(Linear, ReLU, hidden_size, num_classes, in_features, depth, device=device, dtype=dtype)
        )

    def forward(self, x):
        data = x.data if isinstance(x, Tensor) else x
        if data.dim() > 2:
            x = Tensor(data.flatten(1))
        return super().forward(x)
