"""RMSprop, plain or centered, with momentum and weight decay (torch.optim.RMSprop's equations)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import HandOptimizer, as_real, number, scalar_step
from .checks import check_impl_flags, decay_rate, learning_rate, non_negative


class RMSprop(HandOptimizer):
    r"""g = grad + wd * p
    v = alpha * v + (1 - alpha) * g^2                          (square_avg)
    m = alpha * m + (1 - alpha) * g ; d = sqrt(v - m^2) + eps  (centered; m is grad_avg)
    d = sqrt(v) + eps                                          (otherwise)
    b = momentum * b + g / d ; p = p - lr * b                  (momentum > 0)
    p = p - lr * g / d                                         (otherwise)

    The update does not use the step count t; it is kept (as torch.optim keeps it) for the state_dict.
    ``capturable=True`` keeps it on the parameter's device, so that a replayed CUDA graph advances it, and
    reads a tensor ``lr`` on the device (torch.optim's capturable form).  alpha is a decay rate, in [0, 1].
    Arguments in torch.optim.RMSprop's order; ``foreach`` and ``differentiable`` as in optimizers/base.py.
    """

    _hyper = {
        "lr": learning_rate,
        "alpha": decay_rate,
        "eps": non_negative,
        "weight_decay": non_negative,
        "momentum": non_negative,
    }
    _flags = ("centered", "maximize", "capturable")

    def __init__(
        self,
        params,
        lr: float | Tensor = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum: float = 0,
        centered: bool = False,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ):
        flags = check_impl_flags("RMSprop", foreach, differentiable, None)
        del flags["fused"]  # torch.optim.RMSprop has no fused option
        defaults = dict(
            lr=lr,
            alpha=alpha,
            eps=eps,
            weight_decay=weight_decay,
            momentum=momentum,
            centered=centered,
            maximize=maximize,
            capturable=bool(capturable),
            **flags,
        )
        super().__init__(params, defaults)

    def _update(self, group, params, grads):
        alpha, momentum, centered = group["alpha"], group["momentum"], group["centered"]
        lr, capturable = group["lr"], group.get("capturable", False)
        states = [self.state[p] for p in params]
        for p, state in zip(params, states, strict=True):
            if not state:
                state["step"] = scalar_step(p, capturable)
                state["square_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if momentum > 0:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if centered:
                    state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        torch._foreach_add_([s["step"] for s in states], 1)
        square_avgs = [s["square_avg"] for s in states]
        grad_avgs = [s["grad_avg"] for s in states] if centered else []
        bufs = [s["momentum_buffer"] for s in states] if momentum > 0 else []
        if self._has_complex:  # torch.optim's reading: (real, imaginary) pairs, each with its own square average
            params, grads, square_avgs, grad_avgs, bufs = map(as_real, (params, grads, square_avgs, grad_avgs, bufs))
        if group["weight_decay"] != 0:
            grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])

        torch._foreach_mul_(square_avgs, alpha)
        torch._foreach_addcmul_(square_avgs, grads, grads, value=1 - alpha)
        if centered:
            torch._foreach_lerp_(grad_avgs, grads, 1 - alpha)
            avg = torch._foreach_addcmul(square_avgs, grad_avgs, grad_avgs, value=-1)
            torch._foreach_sqrt_(avg)
        else:
            avg = torch._foreach_sqrt(square_avgs)
        torch._foreach_add_(avg, group["eps"])

        on_device = capturable and isinstance(lr, Tensor)  # torch.optim's capturable forms: lr never read back
        if momentum > 0:
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_addcdiv_(bufs, grads, avg)
            if on_device:
                torch._foreach_add_(params, torch._foreach_mul(bufs, -lr))
            else:
                torch._foreach_add_(params, bufs, alpha=-number(lr))
        elif on_device:
            torch._foreach_div_(avg, -lr)
            torch._foreach_addcdiv_(params, grads, avg)
        else:
            torch._foreach_addcdiv_(params, grads, avg, value=-number(lr))
