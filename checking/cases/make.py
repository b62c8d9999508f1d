"""The makers of gradcheck's cases: a case is ``run(fast) -> list[GradResult]``; it draws its inputs (the command
seeds each case), builds the layer and checks it.  Also the inputs that keep a check honest: parameters away from
their defaults (``nontrivial``), entries off a kink (``distinct``, ``kink=True``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from layers import Layer

from ..checker import check_layer, check_loss
from ..numeric import GradResult


def _away_from_zero(x: Tensor, margin: float = 1e-2) -> Tensor:
    """Push entries off the ReLU kink, where the derivative is undefined and differences straddle it."""
    return torch.where(x.abs() < margin, x.sign() * margin + (x == 0) * margin, x)


F64 = torch.float64
Case = Callable[[bool], list[GradResult]]  # run(fast) -> results


def rnd(*shape: int, scale: float = 1.0) -> Tensor:
    """A float64 standard normal tensor of ``shape``, times ``scale``."""
    return torch.randn(*shape, dtype=F64) * scale


def layer_case(
    label: str, make: Callable[[], Layer], *shape: int, kink: bool = False, scale: float = 1.0, mode: str | None = None
) -> Case:
    """A check of ``make()`` on a random (shape) input; ``mode`` "train"/"eval" sets the layer's mode first;
    ``kink`` keeps inputs off a ReLU-like kink."""

    def run(fast: bool) -> list[GradResult]:
        x = rnd(*shape, scale=scale)
        layer = make()
        if mode is not None:
            layer.train(mode == "train")
        tag = f" [{mode}]" if mode else ""
        return check_layer(layer, _away_from_zero(x) if kink else x, name=f"{label}{tag} x{tuple(shape)}", fast=fast)

    return run


def loss_case(label: str, make, input_shape, target_fn) -> Case:
    """A check of the loss ``make()`` on random logits of ``input_shape`` and the target ``target_fn(logits)``."""

    def run(fast: bool) -> list[GradResult]:  # a loss has few inputs: always the full check
        x = rnd(*input_shape, scale=3.0)
        return check_loss(make(), x, target_fn(x), name=f"{label} x{tuple(input_shape)}")

    return run


def nontrivial(layer):
    """Parameters away from their defaults (gamma off 1, beta off 0: a default can hide a missing term) and
    running statistics away from 0 and 1, so eval mode checks them too."""
    with torch.no_grad():
        for name, t in layer.named_parameters():
            t.copy_(torch.rand_like(t) + 0.5 if name.endswith("weight") else torch.randn_like(t))
        for name, t in layer.named_buffers():
            if name.endswith("running_mean"):
                t.copy_(torch.randn_like(t) * 0.5)
            elif name.endswith("running_var"):
                t.copy_(torch.rand_like(t) + 0.5)
    return layer


def distinct(*shape: int, spacing: float = 0.05) -> Tensor:
    """A random arrangement of evenly spaced values (centred on 0): no two entries closer than ``spacing``, so
    a perturbation of eps << spacing never changes which entry is a window's maximum (max pooling's kink)."""
    n = 1
    for s in shape:
        n *= s
    return ((torch.randperm(n, dtype=F64) - (n - 1) / 2) * spacing).view(*shape)


def distinct_case(label: str, make: Callable[[], Layer], *shape: int, mode: str | None = None) -> Case:
    """``layer_case`` on an input of distinct values (``distinct``): for layers that take a maximum."""

    def run(fast: bool) -> list[GradResult]:
        layer = make()
        if mode is not None:
            layer.train(mode == "train")
        tag = f" [{mode}]" if mode else ""
        return check_layer(layer, distinct(*shape), name=f"{label}{tag} x{tuple(shape)}", fast=fast)

    return run


def inputs_case(
    label: str, make: Callable[[], Layer], inputs: Callable[[], tuple], *, mode: str | None = None, **forward_kwargs
) -> Case:
    """A check of ``make()`` on the tuple ``inputs()`` (query, key, value; token ids) with keyword arguments."""

    def run(fast: bool) -> list[GradResult]:
        layer = make()
        if mode is not None:
            layer.train(mode == "train")
        args = inputs()
        tag = f" [{mode}]" if mode else ""
        shapes = ",".join(str(tuple(a.shape)) for a in (args if isinstance(args, tuple) else (args,)))
        return check_layer(layer, args, name=f"{label}{tag} x{shapes}", fast=fast, forward_kwargs=forward_kwargs)

    return run
