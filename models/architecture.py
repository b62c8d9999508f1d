"""The default MLP's shape, shared by Net, its nn.Module twin and the engine's Net."""

from __future__ import annotations

from collections.abc import Callable

from layers.checks import check_int

IN_FEATURES, HIDDEN, DEPTH, CLASSES = 784, 1024, 3, 10  # 28x28 images -> [1024 -> ReLU] x 3 -> 10 classes


def mlp_layers(
    linear: Callable,
    relu: Callable,
    hidden_size: int = HIDDEN,
    num_classes: int = CLASSES,
    in_features: int = IN_FEATURES,
    depth: int = DEPTH,
    **linear_kwargs,
) -> list:
    """in_features -> [hidden_size -> ReLU] x depth -> num_classes, built from the given layer types.

    The Linear layers are made in order, so under one torch.manual_seed every family draws the same weights.
    """
    for name, v, lo in (
        ("hidden_size", hidden_size, 1),
        ("num_classes", num_classes, 1),
        ("in_features", in_features, 1),
        ("depth", depth, 0),
    ):
        check_int("MLP", name, v, lo)
    layers, width = [], in_features
    for _ in range(depth):
        layers += [linear(width, hidden_size, **linear_kwargs), relu()]
        width = hidden_size
    layers.append(linear(width, num_classes, **linear_kwargs))
    return layers
