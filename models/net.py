"""Net: the default MLP (or any list of layers) as a Sequential whose keys match its nn.Module twin."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from layers.activations import ReLU
from layers.checks import BEFORE_FORWARD, check_tensor
from layers.layer import Layer
from layers.linear import Linear
from layers.sequential import Sequential

from .architecture import CLASSES, DEPTH, HIDDEN, IN_FEATURES, mlp_layers


class Net(Sequential):
    """A sequence of layers with a hand-written backward.

    ``Net()`` is the default MLP 784 -> 1024 -> ReLU -> 1024 -> ReLU -> 1024 -> ReLU -> 10;
    ``Net(layers=[...])`` wraps any list of ``Layer``s.  Inputs of rank > 2
    (e.g. images (N, 1, 28, 28)) are flattened to (N, D).

    ``state_dict()`` uses the key names and layouts of the nn.Module twin
    ``PytorchNet`` (``layers.{i}.weight`` as (H, D)), so weights move freely
    between the two.  Everything else -- the reverse walk, parameters, train/eval,
    ``to`` -- is ``Sequential``'s.
    """

    _key_prefix = "layers."

    def __init__(
        self,
        hidden_size: int = HIDDEN,
        num_classes: int = CLASSES,
        in_features: int = IN_FEATURES,
        depth: int = DEPTH,
        *,
        layers: Sequence[Layer] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        if layers is None:
            layers = mlp_layers(Linear, ReLU, hidden_size, num_classes, in_features, depth, device=device, dtype=dtype)
        self._set_layers(list(layers))
        self._in_shape: torch.Size | None = None

    def forward(self, x: Tensor) -> Tensor:
        """x: (N, D) or (N, *) flattened to (N, D) -> logits (N, C)."""
        x = check_tensor("Net", "x", x)
        if x.dim() < 2:
            raise ValueError(f"Net: expected a batch of shape (N, D) or (N, 1, H, W), got {tuple(x.shape)}")
        self._in_shape = x.shape
        return super().forward(x.flatten(1) if x.dim() > 2 else x)  # (N, D) -> (N, C)

    def backward(self, dout: Tensor, need_input_grad: bool = False) -> Tensor | None:  # type: ignore[override]
        """dout: dL/dlogits (N, C) -> dL/dx in the input's shape (None unless ``need_input_grad``)."""
        if self._in_shape is None:
            raise RuntimeError(f"Net: {BEFORE_FORWARD}")
        in_shape, self._in_shape = self._in_shape, None
        dx = super().backward(dout, need_input_grad)
        return dx.reshape(in_shape) if dx is not None else None

    def to_torch(self) -> torch.nn.Module:  # type: ignore[override]  # (Sequential's takes a memo for shared layers)
        """The nn.Module twin (a PytorchNet over these layers' torch equivalents), holding copies of the weights."""
        from layers.sequential import _to_torch

        from .torch_net import PytorchNet

        shared: dict = {}
        return PytorchNet(layers=[_to_torch(layer, shared) for layer in self.layers]).train(self.training)
