"""A layer made of layers, written in the template: its backward is the chain rule through its children.

MultiheadAttention (its out_proj), the Transformer encoder layer and encoder, the GPT's blocks and the GPT itself
call their children's backwards in reverse.  Written in the template (layers/template.py), the base does the
checks, the versions of what ``Saved`` holds, and "backward before forward"; what a composite adds is the backward
split in two (a pipeline's B and W): ``self.back(child, dout)`` is the child's ``backward`` in a fused backward and
its ``backward_input`` under B, with the child's ``backward_weight`` queued.

W's order, fixed: the queue in the order the B's ran, then the composite's own parameter gradients (those its
backward returns) -- the fused backward's order, in which the children add theirs while the math runs and the base
adds the composite's own after it.  So a tensor two children add into (the GPT's tied matrix) gets its terms in the
same order, and B then W equals the fused backward bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, overload

from torch import Tensor

from .layer import BaseLayer, no_graph
from .template import add_grads


class Composite(BaseLayer):
    """A template layer whose backward runs its children's: ``self.back(child, dout, **kw)`` for each child with
    weights (a child without weights is called with its own ``backward``: it has no W), and
    ``self.later(add, *args)`` for a gradient the composite adds itself (the GPT's output matrix)."""

    _queue: list[Callable[[], None]] | None = None  # within backward_input: the W steps, in the order of the B's
    _w_steps: list[Callable[[], None]] | None = None  # from backward_input to backward_weight

    @overload
    def back(self, child: BaseLayer, dout: Tensor, *, need_input_grad: Literal[False], **kwargs: Any) -> None: ...
    @overload
    def back(self, child: BaseLayer, dout: Tensor, **kwargs: Any) -> Tensor: ...

    def back(self, child: BaseLayer, dout: Tensor, **kwargs: Any) -> Tensor | None:
        """The child's backward now (a fused backward), or its B now and its W queued (under ``backward_input``)."""
        if self._queue is None:
            return child.backward(dout, **kwargs)
        dx = child.backward_input(dout, **kwargs)
        self._queue.append(child.backward_weight)
        return dx

    def later(self, add: Callable[..., None], *args) -> None:
        """``add(*args)``, a weight gradient's accumulation: now in a fused backward, in W after a B."""
        if self._queue is None:
            add(*args)
        else:
            self._queue.append(functools.partial(add, *args))

    @no_graph
    def backward_input(self, dout: Tensor, *more, need_input_grad: bool = True, **kwargs):
        """B: the input gradient, every child's W (and the composite's own ``later``) queued for
        ``backward_weight()``; recording no graph, as ``backward``."""
        queue: list[Callable[[], None]] = []
        self._queue = queue
        try:
            dx = super().backward_input(dout, *more, need_input_grad=need_input_grad, **kwargs)
        finally:
            self._queue = None
        self._w_steps = queue
        return dx

    @no_graph
    def backward_weight(self) -> None:
        """W: the queued weight gradients of the last ``backward_input``, in the order its B's ran, then the
        composite's own (the fused backward's order)."""
        grads = self._take_pending_w()  # one W per B, what Saved holds unchanged: checked before any .grad moves
        steps, self._w_steps = self._w_steps or [], None
        for step in steps:
            step()
        if grads:
            add_grads(self, grads)
