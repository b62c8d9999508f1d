"""Adagrad with learning-rate decay and weight decay (torch.optim.Adagrad's equations)."""
from __future__ import annotations

import torch

from .base import HandOptimizer, check_hyper, scalar_step


class Adagrad(HandOptimizer):
    r"""t = t + 1
    g = grad + wd * p
    clr = lr / (1 + (t - 1) * lr_decay)
    s = s + g^2                         (sum, starts at initial_accumulator_value)
    p = p - clr * g / (sqrt(s) + eps)

    As in torch.optim, the state is created when a parameter joins the optimizer.
    """

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0, weight_decay: float = 0,
                 initial_accumulator_value: float = 0, eps: float = 1e-10, *, maximize: bool = False):
        check_hyper("Adagrad", "lr", lr)
        check_hyper("Adagrad", "lr_decay", lr_decay)
        check_hyper("Adagrad", "weight_decay", weight_decay)
        check_hyper("Adagrad", "initial_accumulator_value", initial_accumulator_value)
        check_hyper("Adagrad", "eps", eps)
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, maximize=maximize)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)  # HandOptimizer's: engine Tensors become their torch tensors
        group = self.param_groups[-1]
        for p in group["params"]:
            state = self.state[p]
            if not state:
                state["step"] = scalar_step()
                state["sum"] = torch.full_like(p, group["initial_accumulator_value"],
                                               memory_format=torch.preserve_format)

    def _update(self, group, params, grads):
        states = [self.state[p] for p in params]
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, 1.0)
        if group["weight_decay"] != 0:
            grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
        neg_clrs = [-group["lr"] / (1 + (t.item() - 1) * group["lr_decay"]) for t in steps]
        sums = [s["sum"] for s in states]
        torch._foreach_addcmul_(sums, grads, grads, value=1)
        std = torch._foreach_sqrt(sums)
        torch._foreach_add_(std, group["eps"])
        torch._foreach_addcdiv_(params, grads, std, neg_clrs)
