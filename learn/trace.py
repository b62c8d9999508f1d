"""``python -m learn trace``: one training step of a real network, layer by layer, to see a gradient vanish or explode.

Builds an MLP (or the trainer's CNN) of handgrad's layers, takes a batch of Fashion-MNIST (or the built-in task),
and prints ``model.trace(x, target)``: each layer's shapes, its output's mean, std and share of zeros, the
gradient that reached it and the one it sent back, and each parameter gradient's norm beside the parameter's.
Try ``--activation sigmoid --depth 8`` and watch |dx| shrink towards the input, or ``--init-scale 3`` and
watch it grow.
"""

from __future__ import annotations

import argparse

import torch

from layers import Linear, ReLU, Sequential, Sigmoid, Tanh

from .data import small_task

ACTIVATIONS = {"relu": ReLU, "tanh": Tanh, "sigmoid": Sigmoid}


def build_mlp(in_features: int, hidden: int, depth: int, activation: str, init_scale: float) -> Sequential:
    """in_features -> [hidden -> activation] x depth -> 10, nn.Linear's initialisation times ``init_scale``."""
    layers, width = [], in_features
    for _ in range(depth):
        layers += [Linear(width, hidden, dtype=torch.float64), ACTIVATIONS[activation]()]
        width = hidden
    layers.append(Linear(width, 10, dtype=torch.float64))
    with torch.no_grad():
        for layer in layers:
            if isinstance(layer, Linear):
                layer.weight.mul_(init_scale)
    return Sequential(*layers)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m learn trace", description=__doc__.split("\n\n")[0])
    p.add_argument("--depth", type=int, default=3, help="hidden layers (default: 3)")
    p.add_argument("--hidden", type=int, default=64, help="units per hidden layer (default: 64)")
    p.add_argument("--activation", choices=sorted(ACTIVATIONS), default="relu", help="(default: relu)")
    p.add_argument(
        "--init-scale",
        type=float,
        default=1.0,
        help="multiply nn.Linear's initial weights by this (default: 1): above 1 gradients grow "
        "layer by layer towards the input, below 1 they shrink",
    )
    p.add_argument("--batch", type=int, default=32, help="examples in the batch (default: 32)")
    p.add_argument("--seed", type=int, default=0, help="weights and batch (default: 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for name in ("depth", "hidden", "batch"):
        if getattr(args, name) < 1:
            parser().error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not args.init_scale > 0:
        parser().error(f"--init-scale must be > 0, got {args.init_scale}")
    torch.manual_seed(args.seed)
    x, y, what = small_task(max(args.batch, 64), seed=args.seed)
    x, y = x[: args.batch].flatten(1), y[: args.batch]
    model = build_mlp(x.shape[1], args.hidden, args.depth, args.activation, args.init_scale)
    print(
        f"{what}; a batch of {len(y)}, cross-entropy, float64; {args.depth} hidden layers of {args.hidden} "
        f"{args.activation} units, initial weights x{args.init_scale:g}\n"
    )
    print(model.trace(x, y))
    return 0
