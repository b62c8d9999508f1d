"""What every loss here shares: the layer template (layers/template.py) with a loss's call and its dout.

A loss writes ``forward(input, target) -> (loss, Saved)`` and ``backward(dout, saved) -> dinput``, the math
alone; the base checks, keeps and versions as it does for a layer.  What differs from a layer: it is called
with two tensors, ``crit(input, target)``; its output is a scalar, so ``backward(dout=1.0)`` takes the upstream
gradient of that scalar (a loss scale, a 1/N weight), by default 1; it has no parameters.
"""
from __future__ import annotations

import functools

from torch import Tensor

from layers.checks import BEFORE_FORWARD, check_loss_dout
from layers.template import Template, is_template, wrap_template


class Loss(Template):
    """Base of the losses written in the template (CrossEntropyLoss, MSELoss)."""

    _param_names: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if is_template(cls) or (getattr(cls, "_backward_math", None) is not None and "forward" in cls.__dict__):
            wrap_template(cls)  # as BaseLayer does: a subclass that writes only a new forward math is wrapped too
            if "backward" in cls.__dict__:
                cls.backward = _dout_one_by_default(cls.backward)

    def __call__(self, input: Tensor, target: Tensor) -> Tensor:
        return self.forward(input, target)

    def check_dout(self, dout: object, meta: object) -> None:
        """A forward first; then dout, the upstream gradient of the scalar loss: a number or a one-element
        tensor (a float passes at once: the common call)."""
        if meta is None:
            raise RuntimeError(f"{self!r}: {BEFORE_FORWARD}")
        if not isinstance(dout, float):
            check_loss_dout(self, dout)


def _dout_one_by_default(public):
    """The template's public ``backward(dout)`` with ``dout=1.0`` by default: ``loss.backward()``, as torch's
    ``loss.backward()`` starts from a gradient of 1."""
    @functools.wraps(public)
    def backward(self, dout: float | Tensor = 1.0) -> Tensor:
        return public(self, dout)
    del backward.__wrapped__  # help() and inspect show this signature, dout=1.0, not the math's (dout, saved)
    backward.__dict__.pop("__signature__", None)  # nor the layers' public one, (dout, need_input_grad)
    return backward
