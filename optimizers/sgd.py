"""Stochastic gradient descent with momentum, dampening, Nesterov and weight decay (torch.optim.SGD's equations)."""

from __future__ import annotations

import torch
from torch import Tensor

from kernels import cpp

from .base import HandOptimizer, cpp_usable, number
from .checks import check_impl_flags, learning_rate, non_negative


class SGD(HandOptimizer):
    r"""g = grad + wd * p
    b = g                              on the first step
    b = momentum * b + (1 - dampening) * g   afterwards
    g = g + momentum * b  (nesterov)   or   g = b
    p = p - lr * g

    State per parameter: ``momentum_buffer`` (only when momentum != 0).  No step counter and no number
    read back, so every step can be captured in a CUDA graph; ``capturable`` (torch.optim.SGD has no such
    option) matters only with a tensor ``lr``: then ``p - lr * g`` reads lr on the device instead of as a
    number.  Arguments in torch.optim.SGD's order; ``foreach``, ``differentiable`` and ``fused`` as in
    optimizers/base.py.
    """

    _hyper = {"lr": learning_rate, "momentum": non_negative, "weight_decay": non_negative, "dampening": non_negative}
    _flags = ("nesterov", "maximize", "capturable")

    def __init__(
        self,
        params,
        lr: float | Tensor = 1e-3,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
        capturable: bool = False,
    ):
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
            **check_impl_flags("SGD", foreach, differentiable, fused),
            capturable=bool(capturable),
        )
        super().__init__(params, defaults)

    def _check_values(self, owner: str, values: dict, *, read: bool = True, keys: set | None = None) -> dict:
        checked = super()._check_values(owner, values, read=read, keys=keys)
        if values.get("nesterov") and (values["momentum"] <= 0 or values["dampening"] != 0):
            raise ValueError(
                f"{owner}: nesterov=True requires momentum > 0 and dampening == 0, "
                f"got momentum={values['momentum']!r}, dampening={values['dampening']!r}"
            )
        return checked

    def _update(self, group, params, grads):
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        if momentum != 0 and not (isinstance(lr, Tensor) and group.get("capturable", False)):
            bufs = [self.state[p].get("momentum_buffer") for p in params]
            if all(b is not None for b in bufs) and cpp_usable(params, grads, bufs):
                # every line below in one pass over each parameter (after the first step): kernels/cpp/optimizers.cpp
                cpp.ops.sgd_step(params, grads, bufs, number(lr), momentum, group["dampening"], wd, group["nesterov"])
                return
        if wd != 0:
            grads = torch._foreach_add(grads, params, alpha=wd)
        if momentum != 0:
            bufs, old_bufs, old_grads = [], [], []
            for p, g in zip(params, grads, strict=True):
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = g.clone()
                else:
                    old_bufs.append(buf)
                    old_grads.append(g)
                bufs.append(buf)
            if old_bufs:
                torch._foreach_mul_(old_bufs, momentum)
                torch._foreach_add_(old_bufs, old_grads, alpha=1 - group["dampening"])
            grads = torch._foreach_add(grads, bufs, alpha=momentum) if group["nesterov"] else bufs
        if isinstance(lr, Tensor) and group.get("capturable", False):  # lr read on the device (torch's compiled
            torch._foreach_add_(params, torch._foreach_mul(grads, -lr))  # SGD's form): no read-back
        else:
            torch._foreach_add_(params, grads, alpha=-number(lr))
