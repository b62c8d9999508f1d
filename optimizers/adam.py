"""Adam and AdamW (decoupled weight decay), with AMSGrad (torch.optim.Adam / AdamW's equations)."""

from __future__ import annotations

import torch
from torch import Tensor

from kernels import cpp
from kernels.optimizers import flat_views, tile_like

from .base import HandOptimizer, as_real, compiling, cpp_usable, number, scalar_step, step_dtype
from .checks import betas_pair, check_impl_flags, learning_rate, non_negative


class Adam(HandOptimizer):
    r"""t = t + 1
    g = grad + wd * p                       (Adam: L2 penalty in the gradient)
    p = p * (1 - lr * wd)                   (AdamW, or decoupled_weight_decay=True: decoupled decay instead)
    m = beta1 * m + (1 - beta1) * g         (exp_avg)
    v = beta2 * v + (1 - beta2) * g^2       (exp_avg_sq)
    v_max = max(v_max, v)                   (amsgrad; max_exp_avg_sq, used in place of v below)
    p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
    (computed as p - lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps * sqrt(1 - beta2^t)))

    ``capturable=True``: t and the bias corrections are device tensors, computed as torch.optim's
    capturable (foreach) Adam computes them, in its order of operations (a tensor lr and tensor betas
    too), so the step never reads a number back to the host (see optimizers/base.py).  They are computed
    in t's dtype, which is float64 for float64 parameters whatever torch's default dtype (torch.optim's
    capturable Adam keeps float32 there under a float32 default: 7e-7 off its default path in one step).
    The default path folds sqrt(1 - beta2^t) into the step size and eps (one pass over the parameters
    fewer than torch's form): the same update, rounded differently (float64: relative 1e-15 per step).
    Tensor betas on the default path are read as numbers each step.
    """

    _decoupled = False
    _hyper = {"lr": learning_rate, "betas": betas_pair, "eps": non_negative, "weight_decay": non_negative}
    _flags = ("amsgrad", "maximize", "capturable", "decoupled_weight_decay")

    def __init__(
        self,
        params,
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ):
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            **check_impl_flags(type(self).__name__, foreach, differentiable, fused),
            capturable=bool(capturable),
            decoupled_weight_decay=bool(decoupled_weight_decay or self._decoupled),
        )
        super().__init__(params, defaults)

    def _update(self, group, params, grads):
        lr, (beta1, beta2), wd, amsgrad = group["lr"], group["betas"], group["weight_decay"], group["amsgrad"]
        capturable = group.get("capturable", False)
        decoupled = self._decoupled or group.get("decoupled_weight_decay", False)
        states = [self.state[p] for p in params]
        for p, state in zip(params, states, strict=True):
            if not state:
                state["step"] = scalar_step(p, capturable)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if amsgrad:
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, 1)
        if compiling():  # (capturable, see base.compiling) the counters in the parameters' precision, whatever
            steps = [
                t.to(step_dtype(p, True)) for t, p in zip(steps, params, strict=True)
            ]  # the dtype of a state made eagerly
        if not capturable:  # tensor betas read back once per step
            beta1, beta2 = number(beta1), number(beta2)
            flat = self._flat(params, grads, states, amsgrad, steps)
            if flat is not None:  # one block each (kernels/optimizers.py): the same update, one kernel per line
                # The block is written through a view of the first parameter, which moves only that one's version
                # counter: mark every parameter changed, as a step per tensor does, for the layers' check that
                # what they keep for backward is unchanged (layers/saved.py).
                torch.autograd.graph.increment_version(params)
                params, grads, states, steps = flat
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        max_sqs = [s["max_exp_avg_sq"] for s in states] if amsgrad else []
        if self._has_complex:  # torch.optim's reading: (real, imaginary) pairs, each with its own second moment
            params, grads, exp_avgs, exp_avg_sqs, max_sqs = map(
                as_real, (params, grads, exp_avgs, exp_avg_sqs, max_sqs)
            )
        if not capturable and not amsgrad and cpp_usable(params, grads, exp_avgs, exp_avg_sqs):
            # every line below in one pass over each parameter: kernels/cpp/optimizers.cpp
            neg_step_sizes, eps_hats = self._corrections(group, steps, beta1, beta2)
            l2, decay = (0.0, number(1 - lr * wd)) if decoupled else (float(wd), 1.0)
            cpp.ops.adam_step(params, grads, exp_avgs, exp_avg_sqs, neg_step_sizes, eps_hats, beta1, beta2, l2, decay)
            return
        if wd != 0:
            if decoupled:
                decay = 1 - lr * wd  # a tensor for a tensor lr (torch's expression)
                torch._foreach_mul_(params, decay if capturable else number(decay))
            else:
                grads = torch._foreach_add(grads, params, alpha=wd)

        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        if isinstance(beta2, Tensor):  # torch's form for a tensor beta2 (addcmul's value must be a number)
            torch._foreach_addcmul_(exp_avg_sqs, torch._foreach_mul(grads, 1 - beta2), grads, value=1.0)
        else:
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)

        if amsgrad:
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
        # read off the CPU counters; torch's step size lr / (1 - beta1^t) (evaluated as torch does, in the lr
        # tensor's dtype for a tensor lr), then folded with sqrt(1 - beta2^t):
        # lr/c1 * m / (sqrt(v)/sqrt(c2) + eps) = (lr/c1 * sqrt(c2)) * m / (sqrt(v) + eps*sqrt(c2)), one pass fewer.
        neg_step_sizes, eps_hats = self._corrections(group, steps, beta1, beta2)
        torch._foreach_add_(denom, eps_hats)
        torch._foreach_addcdiv_(params, exp_avgs, denom, neg_step_sizes)

    @staticmethod
    def _corrections(group, steps, beta1: float, beta2: float) -> tuple[list[float], list[float]]:
        """Per parameter, -lr / (1 - beta1^t) * sqrt(1 - beta2^t) and eps * sqrt(1 - beta2^t), as numbers."""
        lr, ts = group["lr"], [t.item() for t in steps]
        sqrt_c2 = [(1 - beta2**t) ** 0.5 for t in ts]
        neg_step_sizes = [-number(lr / (1 - beta1**t)) * r for t, r in zip(ts, sqrt_c2, strict=True)]
        return neg_step_sizes, [group["eps"] * r for r in sqrt_c2]

    @staticmethod
    def _flat(params, grads, states, amsgrad, steps):
        """(params, grads, states, steps) as one block each when the parameters and gradients tile one (and
        every parameter is at the same step), the state then tiled alike (on its first step or after a load);
        else None."""
        t = steps[0].item()
        if len(params) < 2 or any(s.item() != t for s in steps):
            return None
        keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if amsgrad else ("exp_avg", "exp_avg_sq")
        columns = [[s[k] for s in states] for k in keys]
        views = flat_views(params, grads, *columns)  # the usual case after the first step: all in blocks
        if views is None:
            if flat_views(params, grads) is None:
                return None
            # the parameters and gradients are in blocks but the state is not (yet): copy it into blocks that are
            for k, column in zip(keys, columns, strict=True):
                tiled = tile_like(params, column)
                for state, tensor in zip(states, tiled, strict=True):
                    state[k] = tensor
            views = flat_views(params, grads, *[[s[k] for s in states] for k in keys])
            if views is None:
                return None
        flat_state = dict(zip(keys, views[2:], strict=True))
        return [views[0]], [views[1]], [flat_state], [steps[0]]


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr * wd before the Adam step."""

    _decoupled = True

    def __init__(
        self,
        params,
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ):
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
        )
