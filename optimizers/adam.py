"""Adam and AdamW (decoupled weight decay), with AMSGrad (torch.optim.Adam / AdamW's equations)."""
from __future__ import annotations

import torch

from .base import HandOptimizer, check_betas, check_hyper, scalar_step


class Adam(HandOptimizer):
    r"""t = t + 1
    g = grad + wd * p                       (Adam: L2 penalty in the gradient)
    p = p * (1 - lr * wd)                   (AdamW: decoupled decay instead)
    m = beta1 * m + (1 - beta1) * g         (exp_avg)
    v = beta2 * v + (1 - beta2) * g^2       (exp_avg_sq)
    v_max = max(v_max, v)                   (amsgrad; max_exp_avg_sq, used in place of v below)
    p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    (computed as p - lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps * sqrt(1 - beta2^t)))

    ``capturable=True``: t and the bias corrections are device tensors, computed as torch.optim's
    capturable Adam computes them, in its order of operations,
    so the step never reads a number back to the host (see optimizers/base.py).
    """

    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *, maximize: bool = False,
                 capturable: bool = False):
        name = type(self).__name__
        check_hyper(name, "lr", lr)
        betas = check_betas(name, betas)
        check_hyper(name, "eps", eps)
        check_hyper(name, "weight_decay", weight_decay)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        capturable=bool(capturable))
        super().__init__(params, defaults)

    def _update(self, group, params, grads):
        lr, (beta1, beta2), wd, amsgrad = group["lr"], group["betas"], group["weight_decay"], group["amsgrad"]
        capturable = group.get("capturable", False)
        states = [self.state[p] for p in params]
        for p, state in zip(params, states):
            if not state:
                state["step"] = scalar_step(p, capturable)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if amsgrad:
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, 1)
        if wd != 0:
            if self._decoupled:
                torch._foreach_mul_(params, 1 - lr * wd)
            else:
                grads = torch._foreach_add(grads, params, alpha=wd)

        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)

        if amsgrad:
            max_sqs = [s["max_exp_avg_sq"] for s in states]
            torch._foreach_maximum_(max_sqs, exp_avg_sqs)
            denom = torch._foreach_sqrt(max_sqs)
        else:
            denom = torch._foreach_sqrt(exp_avg_sqs)
        if capturable:
            # On the device, in torch.optim's order (so the results agree to the bit): with
            # step = 1 / ((beta1^t - 1) / lr) = -lr / (1 - beta1^t) and r2 = sqrt(1 - beta2^t),
            # p += m / ((sqrt(v) / r2 + eps) / step).  Kernels only: nothing is read back.
            step_size = torch._foreach_pow(beta1, steps)  # beta1^t, one 0-d tensor per parameter
            torch._foreach_sub_(step_size, 1)
            torch._foreach_div_(step_size, lr)
            torch._foreach_reciprocal_(step_size)
            sqrt_c2 = torch._foreach_pow(beta2, steps)
            torch._foreach_sub_(sqrt_c2, 1)
            torch._foreach_neg_(sqrt_c2)
            torch._foreach_sqrt_(sqrt_c2)
            torch._foreach_div_(denom, sqrt_c2)
            torch._foreach_add_(denom, group["eps"])
            torch._foreach_div_(denom, step_size)
            torch._foreach_addcdiv_(params, exp_avgs, denom)
            return
        # Bias corrections per parameter (a loaded state may hold different step counts) as Python floats
        # read off the CPU counters, folded into scalars:
        # lr/c1 * m / (sqrt(v)/sqrt(c2) + eps) = (lr*sqrt(c2)/c1) * m / (sqrt(v) + eps*sqrt(c2)), one pass fewer.
        ts = [t.item() for t in steps]
        sqrt_c2 = [(1 - beta2 ** t) ** 0.5 for t in ts]
        neg_step_sizes = [-lr * r / (1 - beta1 ** t) for t, r in zip(ts, sqrt_c2)]
        torch._foreach_add_(denom, [group["eps"] * r for r in sqrt_c2])
        torch._foreach_addcdiv_(params, exp_avgs, denom, neg_step_sizes)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr * wd before the Adam step."""

    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 capturable: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, capturable=capturable)
