"""Sequential: layers applied in order; its backward walks them in reverse.

The one implementation of the reverse walk, the parameter tree and the state_dict
for every container (``Net`` is a Sequential too).  Keys and layouts are
``torch.nn.Sequential``'s ("0.weight", "1.running_mean", "2.0.bias" when nested).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

import kernels
from kernels import convolution

from .activations import ReLU
from .layer import BaseLayer, Layer, named_parameters_of
from .pool import MaxPool2d


def _takes_need_input_grad(layer: Layer) -> bool:
    try:
        return "need_input_grad" in inspect.signature(layer.backward).parameters
    except (TypeError, ValueError):
        return False


def _leaves(layer: Layer) -> Iterator[Layer]:
    """The layer and, for a container, every layer inside it (depth first, explicit stack)."""
    stack = [layer]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Sequential):
            stack.extend(node.layers)


class BackwardShapeError(ValueError):
    """A layer's backward gave back a dx that is not shaped as its input (the message names the layer)."""


def _with_place(e: Exception, seq: Sequential, i: int, dout: object) -> Exception:
    """``e``, raised inside layer i's backward, with the layer, the dout it was given and the output shape it
    expected in front of its message (the same exception type; raised once, not again by outer containers)."""
    if isinstance(e, BackwardShapeError) or getattr(e, "_handgrad_placed", False):
        return e
    got = f"shape {tuple(dout.shape)}" if isinstance(dout, Tensor) else type(dout).__name__
    where = (
        f"{type(seq).__name__}: the backward of layer {seq._names[i]} ({seq.layers[i]!r}) failed, given dout of "
        f"{got} (its output had shape {tuple(seq._shapes[i + 1]) if seq._shapes[i + 1] is not None else '?'}): "
    )
    try:
        placed = type(e)(where + str(e))
    except Exception:  # an exception type whose constructor takes other arguments: keep it as it is
        return e
    placed._handgrad_placed = True  # type: ignore[attr-defined]  # a mark of our own on the exception
    return placed


class _HookHandle:
    def __init__(self, hooks: list, fn: Callable) -> None:
        self._hooks, self._fn = hooks, fn

    def remove(self) -> None:
        if self._fn in self._hooks:
            self._hooks.remove(self._fn)


class Sequential(BaseLayer):
    """``Sequential(Conv2d(1, 8, 3), ReLU(), Flatten(), Linear(8 * 26 * 26, 10))``; containers nest.

    forward(x): each layer in order.  backward(dout, need_input_grad=False): each layer's
    backward in reverse order, feeding each one's dx to the layer before it.  The first
    layer's dx -- the gradient with respect to the model's input, which is data in
    training -- is computed only when asked (``need_input_grad=True``), as torch computes
    ``x.grad`` only for an input that requires it.

    Children are named "0", "1", ... or, as in ``torch.nn.Sequential(OrderedDict(fc=..., act=...))``, by the
    names of a mapping given instead (``Sequential(OrderedDict(fc=Linear(4, 2), act=ReLU()))``): the names
    are the state_dict's keys ("fc.weight") and come back in ``to_torch()``.
    """

    _key_prefix = ""  # Net names its children "layers.0", "layers.1", ... as its nn.Module twin does

    def __init__(self, *layers: Layer | Mapping[str, Layer] | Sequence[Layer]) -> None:
        """Sequential(a, b, c), Sequential([a, b, c]) or Sequential(OrderedDict(name=layer, ...))."""
        names = None
        given: Any = layers
        if len(layers) == 1 and isinstance(layers[0], Mapping):
            names, given = list(layers[0].keys()), tuple(layers[0].values())
        elif len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            given = tuple(layers[0])
        self._set_layers(list(given), names)

    def _set_layers(self, layers: list[Layer], names: list[str] | None = None) -> None:
        owner = type(self).__name__
        if not layers:
            raise ValueError(f"{owner}: needs at least one layer")
        if names is None:
            names = [str(i) for i in range(len(layers))]
        for name in names:  # torch.nn's rules for a child's name
            if not isinstance(name, str) or not name or "." in name:
                raise ValueError(f"{owner}: a layer's name must be a non-empty string without '.', got {name!r}")
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise TypeError(
                    f"{owner}: layers[{i}] ({type(layer).__name__}) does not implement the Layer "
                    f"protocol (forward, backward, parameters, __call__)"
                )
        seen: dict[int, Layer] = {}
        for layer in (leaf for top in layers for leaf in _leaves(top)):
            if id(layer) in seen:
                # A layer caches only its latest input: used twice in one pass, its backward would be wrong.
                raise ValueError(f"{owner}: the same layer object ({layer!r}) appears twice; use separate instances")
            seen[id(layer)] = layer
        self.layers = layers
        self._names = list(names)  # "0", "1", ... unless named
        self._shapes: list = [None] * (len(layers) + 1)  # set by each forward: each layer's input shape, the output's
        self.training = all(getattr(layer, "training", True) for layer in layers)
        self._skips_dx = [_takes_need_input_grad(layer) for layer in layers]
        self._backward_hooks: list[Callable[[Layer], None]] = []
        self._forward_hooks: list[Callable[[Layer, Tensor], None]] = []

    # -- the container ----------------------------------------------------------------------------------

    def named_children(self) -> Iterator[tuple[str, Layer]]:
        return ((f"{self._key_prefix}{name}", layer) for name, layer in zip(self._names, self.layers, strict=True))

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[Layer]:
        return iter(self.layers)

    def __getitem__(self, i: int) -> Layer:
        return self.layers[i]

    def __repr__(self) -> str:
        inner = "\n".join(
            f"  ({name}): " + repr(layer).replace("\n", "\n  ")
            for name, layer in zip(self._names, self.layers, strict=True)
        )
        return f"{type(self).__name__}(\n{inner}\n)"

    # -- forward and backward ------------------------------------------------------------------------------

    def forward(self, x: Tensor) -> Tensor:
        """x: the first layer's input -> the last layer's output."""
        if self._forward_hooks:
            return self._forward_with_hooks(x)
        shapes = self._shapes = []  # each layer's input shape, then the output's: what each backward must give back
        for layer in self.layers:
            shapes.append(getattr(x, "shape", None))
            x = layer(x)
        shapes.append(getattr(x, "shape", None))
        return x

    def _forward_with_hooks(self, x: Tensor) -> Tensor:
        hooks = self._forward_hooks
        shapes = self._shapes = []
        for layer in self.layers:
            shapes.append(getattr(x, "shape", None))
            x = layer(x)
            for hook in hooks:
                hook(layer, x)
        shapes.append(getattr(x, "shape", None))
        return x

    # (the ignore: a Sequential's backward takes no further upstream gradients, as the template's may)
    def backward(self, dout: Tensor, need_input_grad: bool = False) -> Tensor | None:  # type: ignore[override]
        """dout: dL/d(output) -> dL/dx (None unless ``need_input_grad``); fills every parameter's .grad.

        While the kernels are on, a ReLU followed by a MaxPool2d (a CNN's usual pair) runs its backward inside the
        pool's (``kernels.convolution.relu_max_pool_backward``: the same numbers, the mask taken on the pooled
        gradient instead of a pass over the full-size one); the hooks still see both layers, pool first."""
        layers, hooks, shapes = self.layers, self._backward_hooks, self._shapes
        i = len(layers) - 1
        given = dout
        try:
            while i > 0:
                layer = layers[i]
                given = dout
                if i > 1 and type(layer) is MaxPool2d and type(layers[i - 1]) is ReLU and kernels.enabled():
                    dx = convolution.relu_max_pool_backward(layer, layers[i - 1], dout)
                    if dx is not None:
                        dout = dx
                        for done in (layer, layers[i - 1]):
                            for hook in hooks:
                                hook(done)
                        i -= 2
                        continue
                # need_input_grad only for a layer that takes it (_skips_dx); the Layer protocol does not ask for it
                if self._skips_dx[i]:
                    dout = layer.backward(dout, need_input_grad=True)  # type: ignore[call-arg]
                else:
                    dout = layer.backward(dout)
                if not (isinstance(dout, Tensor) and dout.shape == shapes[i]):
                    self._wrong_dx(i, dout)
                for hook in hooks:
                    hook(layer)
                i -= 1
            first, given = layers[0], dout
            if self._skips_dx[0]:
                dx = first.backward(dout, need_input_grad=need_input_grad)  # type: ignore[call-arg]  # (_skips_dx)
            else:
                dx = first.backward(dout)
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            placed = _with_place(e, self, i, given)
            if placed is e:
                raise
            raise placed from e
        for hook in hooks:
            hook(first)
        if need_input_grad and not (isinstance(dx, Tensor) and dx.shape == shapes[0]):
            self._wrong_dx(0, dx)
        return dx if need_input_grad else None

    def _wrong_dx(self, i: int, dx: object) -> None:
        """Layer i's backward gave back something that cannot be the gradient of its input: say which and why."""
        got = f"shape {tuple(dx.shape)}" if isinstance(dx, Tensor) else type(dx).__name__
        if self._shapes[i] is None:
            return  # no forward recorded a shape (the layer's own backward says what is wrong)
        raise BackwardShapeError(
            f"{type(self).__name__}: the backward of layer {self._names[i]} ({self.layers[i]!r}) returned dx "
            f"of {got}, but its forward's input had shape {tuple(self._shapes[i])}: a layer's backward must "
            f"return the gradient of its input, in the input's shape"
        )

    def trace(self, x: Tensor, target: Tensor, loss=None):
        """One forward and backward, layer by layer, as a table (``layers.trace``): shapes, output statistics,
        dout, dx and every parameter gradient's norm.  The model's gradients and buffers are left as they were."""
        from .trace import trace

        return trace(self, x, target, loss)

    def register_backward_hook(self, fn: Callable[[Layer], None]) -> _HookHandle:
        """Call ``fn(layer)`` right after each child's backward, in the reverse walk (its gradients are final
        for this backward then: data-parallel training starts their all-reduce there).  ``.remove()`` undoes."""
        self._backward_hooks.append(fn)
        return _HookHandle(self._backward_hooks, fn)

    def register_forward_hook(self, fn: Callable[[Layer, Tensor], None]) -> _HookHandle:
        """Call ``fn(layer, output)`` right after each child's forward (a nested container's children are not
        visited: register on it too).  Without hooks the forward pays one list check.  ``.remove()`` undoes."""
        self._forward_hooks.append(fn)
        return _HookHandle(self._forward_hooks, fn)

    # -- conversion ---------------------------------------------------------------------------------------

    def to_torch(self, _shared: dict | None = None) -> torch.nn.Sequential:
        """The equivalent torch.nn.Sequential, holding copies of every weight and buffer, in the same mode.  Two
        layers that hold the very same tensors (``from_torch`` of a module used twice) become one torch module
        used twice again; a tensor two layers share (a tied weight) becomes one torch Parameter in both."""
        shared = {} if _shared is None else _shared
        module = torch.nn.Sequential(
            OrderedDict((name, _to_torch(layer, shared)) for name, layer in zip(self._names, self.layers, strict=True))
        )
        module.training = self.training  # its own flag only: each child keeps its own mode (a BatchNorm in eval)
        return module


def _to_torch(layer: Layer, shared: dict | None = None) -> torch.nn.Module:
    """``layer.to_torch()``; with ``shared`` (a dict carried through one conversion), a layer whose parameters and
    buffers are the very tensors of a layer converted before gives that layer's torch module again."""
    convert = getattr(layer, "to_torch", None)
    if convert is None:
        raise TypeError(f"{type(layer).__name__} has no to_torch(): it cannot be turned into a torch.nn module")
    if shared is None:
        return convert()
    if isinstance(layer, Sequential):
        return layer.to_torch(shared)
    key = tuple(id(t) for t in (*layer.parameters(), *(b for _, b in getattr(layer, "named_buffers", tuple)())))
    if key and key in shared:
        return shared[key]
    module = convert()
    if key:
        shared[key] = module
    _tie_torch(layer, module, shared.setdefault("parameters", {}))
    return module


def _tie_torch(layer: Layer, module: torch.nn.Module, converted: dict) -> None:
    """Make each of ``module``'s parameters whose hand-written tensor was converted before (``converted``: id of the
    tensor -> its torch Parameter) that very Parameter: a tied weight stays tied."""
    theirs = dict(module.named_parameters(remove_duplicate=False))
    for name, t in named_parameters_of(layer):
        p = theirs.get(name)
        if p is None:
            continue
        first = converted.setdefault(id(t), p)
        if first is not p:
            owner, _, attr = name.rpartition(".")
            setattr(module.get_submodule(owner), attr, first)
