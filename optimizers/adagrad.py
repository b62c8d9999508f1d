"""Adagrad with learning-rate decay and weight decay (torch.optim.Adagrad's equations)."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import HandOptimizer, as_real, number, scalar_step
from .checks import check_impl_flags, learning_rate, non_negative


class Adagrad(HandOptimizer):
    r"""t = t + 1
    g = grad + wd * p
    clr = lr / (1 + (t - 1) * lr_decay)
    s = s + g^2                         (sum, starts at initial_accumulator_value)
    p = p - clr * g / (sqrt(s) + eps)

    As in torch.optim, the state is created when a parameter joins the optimizer.

    ``capturable=True`` (torch.optim.Adagrad has no such option; this one has torch's meaning for the
    others) keeps t on the parameter's device and computes k = 1 + (t - 1) lr_decay there, in the
    parameter's dtype: p = p - lr * g / ((sqrt(s) + eps) * k), and reads a tensor lr there too (as
    torch's capturable RMSprop does: p = p + g / (std * k / -lr)).  No number is read back.
    Arguments in torch.optim.Adagrad's order; ``foreach``, ``differentiable`` and ``fused`` as in
    optimizers/base.py.
    """

    _hyper = {
        "lr": learning_rate,
        "lr_decay": non_negative,
        "weight_decay": non_negative,
        "initial_accumulator_value": non_negative,
        "eps": non_negative,
    }
    _flags = ("maximize", "capturable")

    def __init__(
        self,
        params,
        lr: float | Tensor = 1e-2,
        lr_decay: float = 0,
        weight_decay: float = 0,
        initial_accumulator_value: float = 0,
        eps: float = 1e-10,
        foreach: bool | None = None,
        *,
        maximize: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        capturable: bool = False,
    ):
        defaults = dict(
            lr=lr,
            lr_decay=lr_decay,
            eps=eps,
            weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value,
            maximize=maximize,
            **check_impl_flags("Adagrad", foreach, differentiable, fused),
            capturable=bool(capturable),
        )
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)  # HandOptimizer's: engine Tensors become their torch tensors
        group = self.param_groups[-1]
        for p in group["params"]:
            state = self.state[p]
            if not state:
                state["step"] = scalar_step(p, group.get("capturable", False))
                init = group["initial_accumulator_value"]  # torch.optim's: both parts of a complex sum
                state["sum"] = torch.full_like(
                    p, complex(init, init) if p.is_complex() else init, memory_format=torch.preserve_format
                )

    def _update(self, group, params, grads):
        states = [self.state[p] for p in params]
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, 1)
        sums = [s["sum"] for s in states]
        if self._has_complex:  # torch.optim's reading: (real, imaginary) pairs, each with its own sum
            params, grads, sums = map(as_real, (params, grads, sums))
        if group["weight_decay"] != 0:
            grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
        torch._foreach_addcmul_(sums, grads, grads, value=1)
        std = torch._foreach_sqrt(sums)
        torch._foreach_add_(std, group["eps"])
        lr, lr_decay = group["lr"], group["lr_decay"]
        capturable = group.get("capturable", False)
        if capturable and lr_decay != 0:
            # clr = lr / k with k = 1 + (t - 1) lr_decay, computed on the device: p = p - lr * g / (std * k).
            # t (exact in float32 up to 2^24 steps) is cast to the parameter's dtype first, so k is as precise
            # as the Python float of the default path.
            ks = torch._foreach_sub(
                [t.to(p.dtype) for t, p in zip(steps, params, strict=True)], 1
            )  # new tensors, (t - 1)
            torch._foreach_mul_(ks, lr_decay)
            torch._foreach_add_(ks, 1)
            torch._foreach_mul_(std, ks)
        if capturable and isinstance(lr, Tensor):  # lr read on the device: p + g / (std / -lr)
            torch._foreach_div_(std, -lr)
            torch._foreach_addcdiv_(params, grads, std)
        elif capturable or lr_decay == 0:  # clr = lr whatever t is (or k is already in std): no counter to read
            torch._foreach_addcdiv_(params, grads, std, value=-number(lr))
        else:  # CPU counters: no device sync; torch's clr, in the lr tensor's dtype for a tensor lr
            neg_clrs = [-number(lr / (1 + (t.item() - 1) * lr_decay)) for t in steps]
            torch._foreach_addcdiv_(params, grads, std, neg_clrs)
