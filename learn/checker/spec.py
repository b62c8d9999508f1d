"""What the checker knows about one layer exercise: its inputs, its autograd reference and its known mistakes.

Each exercise is checked on several configurations (``configs``, ``random``; see configs.py).  The inputs are
small, random, float64 and non-square (a transpose cannot hide); parameters are set away from their
defaults (a gamma of 1 or a bias of 0 can hide a missing term).  ``reference`` computes the forward from leaves
that require grad (and the constructor's arguments, by name): autograd gives every expected gradient, named
``d<input>`` (``dx``, ``dq``) for an input and
``<param>.grad`` for a parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from torch import Tensor

from ..mistakes import Mistake

F64 = torch.float64


def normal(g: torch.Generator, *shape: int, std: float = 1.0, mean: float = 0.0) -> Tensor:
    return torch.randn(*shape, generator=g, dtype=F64) * std + mean


def uniform(g: torch.Generator, *shape: int, lo: float = -1.0, hi: float = 1.0) -> Tensor:
    return torch.rand(*shape, generator=g, dtype=F64) * (hi - lo) + lo


def wrong(key: str, tensor: str, formula: str, why: str, fn: Callable[[SimpleNamespace], Tensor]) -> Mistake:
    """A mistake that changes one tensor: ``fn(ctx)`` is that tensor's value under the wrong formula."""
    return Mistake(key, formula, why, lambda c: {tensor: fn(c)})


def call_forward(obj, inputs: dict[str, Tensor]):
    return obj.forward(*inputs.values())


def call_backward(obj, douts: dict[str, Tensor]):
    return obj.backward(*douts.values())


@dataclass
class LayerSpec:
    name: str
    cls: str
    ctor: dict  # the constructor's keyword arguments: small, non-square
    params: dict[str, Callable[[torch.Generator], Tensor]]  # each parameter's checked value, away from defaults
    inputs: Callable[[torch.Generator], dict[str, Tensor]]  # the forward's inputs, in the order forward takes them
    reference: Callable[[SimpleNamespace], dict[str, Tensor]]  # the forward's outputs, by name, from the leaves
    mistakes: list[Mistake] = field(default_factory=list)
    context: Callable[[SimpleNamespace], dict] | None = None  # intermediate values the mistakes' formulas use
    forward: Callable = call_forward  # (learner's object, inputs) -> what its forward returns
    backward: Callable = call_backward  # (learner's object, douts) -> what its backward returns
    loss: bool = False  # a loss: backward() takes no dout (dL/dloss = 1)
    constants: tuple[str, ...] = ()  # float inputs that take no gradient (a loss's target)
    returns: tuple[str, ...] | None = None  # the names of what backward returns; default: d<input> per float input
    where: dict[str, str] = field(default_factory=dict)  # tensor -> the likeliest place of a mistake in it
    seed: int = 0
    label: str = "the default"  # which configuration this is, in a report
    configs: list[dict] = field(default_factory=list)  # more configurations: each a label and overrides
    random: Callable[[torch.Generator], dict] | None = None  # a seeded random configuration's overrides
    numeric: bool = True  # central differences of the learner's forward are part of the verdict here
    nan_hint: str = ""  # where a nan or inf comes from in this exercise
    shared: list[tuple[tuple[str, ...], str]] = field(default_factory=list)  # tensors computed from one
    # intermediate, and where that is: all of them wrong, the others right, points there
    layout: Callable[[SimpleNamespace], dict[str, list[Tensor]]] | None = None  # after construction, the learner's
    # object's lists of tensors at these attribute paths ("fc1.weights": one shard per rank) must hold these
    layout_mistakes: list[tuple[Mistake, Callable[[SimpleNamespace], dict[str, list[Tensor]]]]] = field(
        default_factory=list
    )  # a known wrong layout, and the lists it would give
    versus: str = "PyTorch's autograd"  # what the expected values are, in the report's verdict
    replicas: tuple[str, ...] = ()  # attribute paths of lists (one tensor per simulated rank) that must hold one
    # value on every rank after each backward
    formula: Callable[[SimpleNamespace], dict[str, Tensor]] | None = None  # the right backward from named tensors
    # of the context, its sums through families.reduce_of: the families of mistakes are replayed from it
    saved: dict[str, str] = field(default_factory=dict)  # the tensors a backward may read, each in a few words: a
    # family case swaps one for another of its shape
