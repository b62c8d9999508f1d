"""The default MLP's shape, shared by Net, its nn.Module twin and the engine's Net."""
from __future__ import annotations

from collections.abc import Callable


def validate_architecture(hidden_size: int, num_classes: int, in_features: int, depth: int) -> None:
    for name, v, lo in (("hidden_size", hidden_size, 1), ("num_classes", num_classes, 1),
                        ("in_features", in_features, 1), ("depth", depth, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")


def mlp_layers(linear: Callable, relu: Callable, hidden_size: int, num_classes: int, in_features: int,
               depth: int, **linear_kwargs) -> list:
    """in_features -> [hidden_size -> ReLU] x depth -> num_classes, built from the given layer types.

    The Linear layers are made in order, so under one torch.manual_seed every family draws the same weights.
    """
    validate_architecture(hidden_size, num_classes, in_features, depth)
    layers, width = [], in_features
    for _ in range(depth):
        layers += [linear(width, hidden_size, **linear_kwargs), relu()]
        width = hidden_size
    layers.append(linear(width, num_classes, **linear_kwargs))
    return layers
