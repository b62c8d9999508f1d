"""RMSprop, plain or centered, with momentum and weight decay (torch.optim.RMSprop's equations)."""
from __future__ import annotations

import torch
from torch import Tensor

from .base import HandOptimizer, check_hyper, check_impl_flags, check_scalar_tensor, number, scalar_step


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

    def __init__(self, params, lr: float | Tensor = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False, differentiable: bool = False):
        lr = check_scalar_tensor("RMSprop", "lr", lr)
        check_hyper("RMSprop", "alpha", alpha, hi=1.0)
        check_hyper("RMSprop", "eps", eps)
        check_hyper("RMSprop", "weight_decay", weight_decay)
        check_hyper("RMSprop", "momentum", momentum)
        flags = check_impl_flags("RMSprop", foreach, differentiable, None)
        del flags["fused"]  # torch.optim.RMSprop has no fused option
        defaults = dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                        centered=centered, maximize=maximize, capturable=bool(capturable), **flags)
        super().__init__(params, defaults)

    def _update(self, group, params, grads):
        alpha, momentum, centered = group["alpha"], group["momentum"], group["centered"]
        lr, capturable = group["lr"], group.get("capturable", False)
        states = [self.state[p] for p in params]
        for p, state in zip(params, states):
            if not state:
                state["step"] = scalar_step(p, capturable)
                state["square_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if momentum > 0:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if centered:
                    state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        torch._foreach_add_([s["step"] for s in states], 1)
        if group["weight_decay"] != 0:
            grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])

        square_avgs = [s["square_avg"] for s in states]
        torch._foreach_mul_(square_avgs, alpha)
        torch._foreach_addcmul_(square_avgs, grads, grads, value=1 - alpha)
        if centered:
            grad_avgs = [s["grad_avg"] for s in states]
            torch._foreach_lerp_(grad_avgs, grads, 1 - alpha)
            avg = torch._foreach_addcmul(square_avgs, grad_avgs, grad_avgs, value=-1)
            torch._foreach_sqrt_(avg)
        else:
            avg = torch._foreach_sqrt(square_avgs)
        torch._foreach_add_(avg, group["eps"])

        on_device = capturable and isinstance(lr, Tensor)  # torch.optim's capturable forms: lr never read back
        if momentum > 0:
            bufs = [s["momentum_buffer"] for s in states]
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
