"""What every loss here shares: the layer template (layers/template.py) with a loss's call and its dout.

A loss writes ``forward_math(input, target) -> (loss, Saved)`` and ``backward_math(dout, saved) -> dinput``, the
math alone; the base checks, keeps and versions as it does for a layer.  What differs from a layer: it is called
with two tensors, ``crit(input, target)``; its output is a scalar, so ``backward(dout=1.0)`` takes the upstream
gradient of that scalar (a loss scale, a 1/N weight), by default 1; it has no parameters.
"""

from __future__ import annotations

from torch import Tensor

from layers.checks import BEFORE_FORWARD, check_loss_dout
from layers.template import Template


class Loss(Template):
    """Base of the losses written in the template (CrossEntropyLoss, MSELoss)."""

    def __call__(self, input: Tensor, target: Tensor) -> Tensor:
        return self.forward(input, target)

    def backward(self, dout: float | Tensor = 1.0) -> Tensor:  # type: ignore[override]  # a loss takes dout only
        """dL/dinput, times ``dout`` (the upstream gradient of the scalar loss, 1 by default: ``loss.backward()``
        starts from a gradient of 1, as torch's does)."""
        return Template.backward(self, dout)

    def check_dout(self, grads: tuple, meta: object, saved: object) -> None:
        """A forward first; then dout, the upstream gradient of the scalar loss: a number or a one-element
        tensor (a float passes at once: the common call)."""
        if meta is None:
            raise RuntimeError(f"{self!r}: {BEFORE_FORWARD}")
        if not isinstance(grads[0], float):
            check_loss_dout(self, grads[0])
