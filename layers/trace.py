"""A one-step trace of a container: per layer, what the forward made and what the backward sent back.

``model.trace(x, target)`` runs one forward and one backward of a ``Sequential`` (or ``Net``) layer by layer and
returns a table: each layer's input and output shapes, the output's mean, std and fraction of zeros, the
gradient that reached the layer (dout), the one it sent on (dx), and each parameter gradient's norm beside the
parameter's own.  A gradient that vanishes (norms falling layer after layer towards the input) or explodes shows
as a column of numbers; a dead ReLU as a fraction of zeros near 1.

The trace leaves the model as it found it: the parameters' ``.grad`` and the buffers (batch norm's running
statistics) are put back afterwards, and so is the random state its dropout masks drew from (torch's, on the CPU
and the model's CUDA device, and a layer's own generator), so tracing between two training steps changes nothing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from .layer import BaseLayer, Layer, named_parameters_of


@dataclass
class TraceRow:
    """One layer of the trace; norms are Frobenius norms (``t.norm()``), None where the layer has none."""

    name: str
    layer: str
    in_shape: tuple
    out_shape: tuple
    out_mean: float
    out_std: float
    out_zeros: float  # the fraction of the output that is exactly 0 (dead ReLU units)
    dout_norm: float | None = None
    dx_norm: float | None = None
    grads: dict[str, tuple[float, float]] = field(default_factory=dict)  # parameter -> (|grad|, |param|)


@dataclass
class Trace:
    """The rows, first layer first, and the loss; ``str(trace)`` is the table."""

    rows: list[TraceRow]
    loss: float

    def __str__(self) -> str:
        head = ["layer", "in -> out", "out mean/std", "zeros", "|dout|", "|dx|", "|grad| / |param|"]
        lines = [head]
        for r in self.rows:
            grads = ", ".join(f"{n} {g:.2e}/{p:.2e}" for n, (g, p) in r.grads.items())
            lines.append(
                [
                    f"{r.name} {r.layer}",
                    f"{_shape(r.in_shape)} -> {_shape(r.out_shape)}",
                    f"{r.out_mean:+.3f}/{r.out_std:.3f}",
                    f"{r.out_zeros:.0%}",
                    _num(r.dout_norm),
                    _num(r.dx_norm),
                    grads or "-",
                ]
            )
        widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
        text = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in lines]
        text.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(text) + f"\nloss {self.loss:.6g}; the backward runs from the last row up"


def _shape(s: tuple) -> str:
    return "(" + ", ".join(map(str, s)) + ")"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2e}"


def _leaves(model) -> list[tuple[str, Layer]]:
    """(dotted name, layer) for every non-container layer, in forward order (nested Sequentials opened: a container
    is a layer whose ``layers`` list its forward runs in order)."""
    out, stack = [], [("", model)]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, BaseLayer) and isinstance(getattr(node, "layers", None), list):
            stack.extend((f"{prefix}{name}.", child) for name, child in reversed(list(node.named_children())))
        else:
            out.append((prefix.rstrip("."), node))
    return out


class _TorchLoss:
    """A torch.nn.functional loss with handgrad's loss protocol: ``loss(out, target)``, then ``backward()`` -> dout."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self._out: Tensor | None = None

    def __call__(self, out: Tensor, target: Tensor) -> Tensor:
        self._out = out.detach().requires_grad_()
        self._value = self.fn(self._out, target)
        return self._value.detach()

    def backward(self) -> Tensor:
        if self._out is None:
            raise RuntimeError(f"{self.fn}: backward before the loss was computed")
        (dout,) = torch.autograd.grad(self._value, self._out)
        return dout


@contextlib.contextmanager
def _generators_kept(generators: list[torch.Generator]):
    """Restore each generator's state on leaving (the layers' own, which fork_rng does not cover)."""
    states = [g.get_state() for g in generators]
    try:
        yield
    finally:
        for g, state in zip(generators, states, strict=True):
            g.set_state(state)


def trace(model, x: Tensor, target: Tensor, loss=None) -> Trace:
    """One forward and backward of ``model`` (a Sequential or Net) on ``x`` and ``target``, layer by layer.

    ``loss``: a handgrad loss (``losses.CrossEntropyLoss()``, ...): ``loss(out, target)`` then ``loss.backward()``
    gives the gradient the trace starts from.  When None, torch's cross-entropy (integer targets) or mean squared
    error (floating-point ones) and its gradient from autograd: the trace's subject is the model, and layers/ does not
    reach up to losses/.  Returns a ``Trace``; ``print(trace)`` shows the table."""
    if loss is None:
        loss = _TorchLoss(F.mse_loss if target.is_floating_point() else F.cross_entropy)
    if getattr(model, "_key_prefix", "") == "layers." and x.dim() > 2:
        x = x.flatten(1)  # what Net.forward does with an image batch
    params = model.parameters()
    grads = [p.grad for p in params]  # put back afterwards: tracing changes no training state
    buffers = [(b, b.clone()) for _, b in model.named_buffers()]
    for p in params:
        p.grad = None
    layers = _leaves(model)
    # the random state its dropout masks draw from, put back too: the next training step draws what it would have
    generators = [g for _, layer in layers if isinstance(g := getattr(layer, "generator", None), torch.Generator)]
    cuda = sorted(
        {
            t.device.index if t.device.index is not None else torch.cuda.current_device()
            for t in (x, *params)
            if t.device.type == "cuda"
        }
    )
    with torch.random.fork_rng(devices=cuda), _generators_kept(generators):
        return _trace(layers, x, target, loss, params, grads, buffers)


def _trace(layers, x, target, loss, params, grads, buffers) -> Trace:
    """trace's forward and backward, the model's .grad and buffers put back afterwards."""
    try:
        rows = []
        for name, layer in layers:
            out = layer(x)
            rows.append(
                TraceRow(
                    name,
                    type(layer).__name__,
                    tuple(x.shape),
                    tuple(out.shape),
                    out.mean().item(),
                    out.std().item() if out.numel() > 1 else 0.0,
                    (out == 0).float().mean().item(),
                )
            )
            x = out
        value = loss(x, target)
        dout = loss.backward()
        for row, (_, layer) in zip(reversed(rows), reversed(layers), strict=True):
            row.dout_norm = dout.norm().item()
            dout = layer.backward(dout)
            row.dx_norm = dout.norm().item() if isinstance(dout, Tensor) else None
            named = list(layer.named_parameters()) if isinstance(layer, BaseLayer) else named_parameters_of(layer)
            row.grads = {n: (p.grad.norm().item(), p.norm().item()) for n, p in named if p.grad is not None}
        return Trace(rows, value.item())
    finally:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
