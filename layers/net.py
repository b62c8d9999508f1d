"""Net: a stack of hand-written layers whose backward walks them in reverse."""
from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import Tensor

from ._checks import check_tensor
from .activations import ReLU
from .architecture import mlp_layers
from .layer import Layer, named_parameters_of
from .linear import Linear


class Net:
    """A sequence of layers with a hand-written backward.

    ``Net()`` is the default MLP 784 -> 1024 -> ReLU -> 1024 -> ReLU -> 1024 -> ReLU -> 10;
    ``Net(layers=[...])`` wraps any list of ``Layer``s.  Inputs of rank > 2
    (e.g. images (N, 1, 28, 28)) are flattened to (N, D).

    ``state_dict()`` uses the key names and layouts of the nn.Module twin
    ``PytorchNet`` (``layers.{i}.weight`` as (H, D)), so weights move freely
    between the two.
    """

    def __init__(self, hidden_size: int = 1024, num_classes: int = 10, in_features: int = 784, depth: int = 3,
                 *, layers: Sequence[Layer] | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        if layers is None:
            layers = mlp_layers(Linear, ReLU, hidden_size, num_classes, in_features, depth, device=device, dtype=dtype)
        layers = list(layers)
        if not layers:
            raise ValueError("Net: needs at least one layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise TypeError(f"Net: layers[{i}] ({type(layer).__name__}) does not implement the Layer protocol "
                                f"(forward, backward, parameters, __call__)")
        if len({id(layer) for layer in layers}) != len(layers):
            # A layer caches only its latest input: used twice in one pass, its backward would be wrong.
            raise ValueError("Net: the same layer object appears twice; use separate instances")
        self.layers = layers
        self.training = True
        # The first layer's dx is never needed in training: skip that GEMM where the layer allows it.
        self._first_skips_dx = "need_input_grad" in inspect.signature(layers[0].backward).parameters
        self._in_shape: torch.Size | None = None

    def __repr__(self) -> str:
        inner = "\n".join(f"  ({i}): {layer!r}" for i, layer in enumerate(self.layers))
        return f"Net(\n{inner}\n)"

    def __call__(self, x: Tensor) -> Tensor:
        return self.forward(x)

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, D) or (N, *) flattened to (N, D) -> logits (N, C)."""
        check_tensor("Net", "x", x)
        if x.dim() < 2:
            raise ValueError(f"Net: expected a batch of shape (N, D) or (N, 1, H, W), got {tuple(x.shape)}")
        self._in_shape = x.shape
        h = x.flatten(1) if x.dim() > 2 else x  # (N, D)
        for layer in self.layers:
            h = layer(h)
        return h

    def backward(self, dout: Tensor, need_input_grad: bool = True) -> Tensor | None:
        """dout: dL/dlogits (N, C) -> dL/dx in the input's shape (None if need_input_grad=False)."""
        if self._in_shape is None:
            raise RuntimeError("Net: backward called before forward (or twice after one forward)")
        in_shape, self._in_shape = self._in_shape, None
        for layer in reversed(self.layers[1:]):
            dout = layer.backward(dout)
        first = self.layers[0]
        if not need_input_grad and self._first_skips_dx:
            first.backward(dout, need_input_grad=False)
            return None
        dx = first.backward(dout)
        return dx.reshape(in_shape) if need_input_grad else None

    # -- parameters ---------------------------------------------------------------------------------

    def named_parameters(self) -> Iterator[tuple[str, Tensor]]:
        for i, layer in enumerate(self.layers):
            for name, p in named_parameters_of(layer):
                yield f"layers.{i}.{name}", p

    def parameters(self) -> list[Tensor]:
        return [p for layer in self.layers for p in layer.parameters()]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's .grad (to None by default, as torch does)."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def train(self, mode: bool = True) -> "Net":
        self.training = mode
        return self

    def eval(self) -> "Net":
        return self.train(False)

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "Net":
        """Move/cast parameters in place (their identity is kept, so optimizers built earlier still see them)."""
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"Net.to: dtype must be floating point, got {dtype}")
        for p in self.parameters():
            p.data = p.data.to(device=device, dtype=dtype)
            if p.grad is not None:
                p.grad = p.grad.to(device=device, dtype=dtype)
        return self

    # -- state_dict -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Tensor]:
        """PytorchNet's keys and layouts; tensors share storage with the parameters (as in torch)."""
        sd: dict[str, Tensor] = {}
        for i, layer in enumerate(self.layers):
            own = getattr(layer, "state_dict", None)
            pairs = own().items() if own is not None else dict(named_parameters_of(layer)).items()
            for name, t in pairs:
                sd[f"layers.{i}.{name}"] = t
        return sd

    def load_state_dict(self, state_dict: Mapping[str, Tensor]) -> None:
        """Copy weights in from a Net or PytorchNet state_dict; keys must match exactly."""
        expected = set(self.state_dict())
        missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
        if missing or unexpected:
            raise KeyError(f"Net.load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        for i, layer in enumerate(self.layers):
            prefix = f"layers.{i}."
            sub = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
            own = getattr(layer, "load_state_dict", None)
            if own is not None:
                own(sub, prefix=prefix)
                continue
            for name, p in named_parameters_of(layer):
                if sub[name].shape != p.shape:
                    raise ValueError(f"Net.load_state_dict: '{prefix}{name}' has shape {tuple(sub[name].shape)}, "
                                     f"expected {tuple(p.shape)}")
                with torch.no_grad():
                    p.copy_(sub[name])
