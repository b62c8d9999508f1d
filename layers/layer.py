"""The Layer protocol: what every hand-written layer provides.

Shape legend used throughout ``layers/``:
    N = batch size, D = in_features, H = out_features, C = classes.

A layer is any object with

    forward(x)      -> out           caches what backward needs
    backward(dout)  -> dx            dL/dx; adds dL/dparam into each parameter's .grad
    parameters()    -> list[Tensor]  plain tensors, requires_grad=False
    __call__(x)     == forward(x)

Gradients *accumulate* (``p.grad += ...``) as in PyTorch; ``zero_grad()`` on a
``Net`` or an optimizer clears them.  Each backward consumes the cache of the
forward before it, so calling backward twice without a forward is an error,
never a silent doubling.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class Layer(Protocol):
    def forward(self, x: Tensor) -> Tensor: ...

    def backward(self, dout: Tensor) -> Tensor: ...

    def parameters(self) -> list[Tensor]: ...

    def __call__(self, x: Tensor) -> Tensor: ...


def accumulate_grad(param: Tensor, grad: Tensor) -> None:
    """``param.grad += grad``, creating ``.grad`` on first use (PyTorch's semantics)."""
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


def named_parameters_of(layer: Layer) -> list[tuple[str, Tensor]]:
    """``layer.named_parameters()`` where the layer has it, else its parameters numbered 0, 1, ..."""
    named = getattr(layer, "named_parameters", None)
    if named is not None:
        return list(named())
    return [(str(j), p) for j, p in enumerate(layer.parameters())]
