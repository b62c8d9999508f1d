"""HandOptimizer: torch.optim.Optimizer plumbing around a hand-written, vectorised update.

Subclassing ``torch.optim.Optimizer`` gives param_groups, state_dict /
load_state_dict, zero_grad, add_param_group, hooks and every lr_scheduler for
free; each subclass writes only ``_update(group, params, grads)``, the update
equations, with ``torch._foreach_*`` ops across the group (one kernel per
operation for the whole group rather than one per tensor).

``capturable`` has torch.optim's meaning.  Off (the default), a step counter is a
0-d CPU tensor and the bias corrections are Python floats computed from it: cheap,
since reading a CPU number never waits for the GPU, but a replayed CUDA graph would
never advance such a counter.  On, the counter lives on the parameter's device and
every scalar that depends on it (bias corrections, Adagrad's decayed rate) is a
device tensor computed by kernels, so the step does no host synchronisation and no
host-to-device copy and can be captured in a CUDA graph (``training.cuda_graph``).
Hyper-parameters (lr, betas, ...) are Python numbers passed to the kernels as
arguments: a captured graph keeps the values it was captured with.

A tensor ``lr`` (and Adam's tensor ``betas``), as torch.optim takes them: one element,
kept as given in ``param_groups`` (so an lr_scheduler, which ``fill_``s a tensor lr in
place, changes that very tensor).  With ``capturable=True`` the kernels read it on the
device, in torch.optim's capturable order of operations, so a schedule keeps working
inside a captured CUDA graph.  Otherwise each step reads its value (``.item()``: put it
on the CPU) into the same scalar expressions torch's per-tensor code evaluates with it.

torch.optim's implementation switches are accepted with torch's meaning where they
mean something here: ``foreach`` None/True/False all run the one vectorised update
(``torch._foreach_*``; on the CPU those kernels loop over the tensors, so False would
compute the same numbers one tensor at a time); ``differentiable=False`` and
``fused=None/False`` are accepted, and ``differentiable=True`` / ``fused=True`` are
refused with a ValueError saying why (the update is hand-written outside autograd, and
it is the foreach one, not a fused kernel).
"""
from __future__ import annotations

import math
import numbers
from abc import abstractmethod

import torch
from torch import Tensor
from torch.optim import Optimizer


def check_hyper(owner: str, name: str, value: object, *, lo: float = 0.0, hi: float | None = None,
                hi_open: bool = False) -> float:
    """Refuse a hyper-parameter that is not a finite real number in [lo, hi] (or [lo, hi) with hi_open)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{owner}: {name} must be a number, got {value!r}")
    ok = math.isfinite(value) and value >= lo and (hi is None or (value < hi if hi_open else value <= hi))
    if not ok:
        upper = "" if hi is None else f", {hi})" if hi_open else f", {hi}]"
        rng = f"finite and >= {lo}" if hi is None else f"in [{lo}{upper}"
        raise ValueError(f"{owner}: invalid {name} {value!r}: must be {rng}")
    return float(value)


def check_scalar_tensor(owner: str, name: str, value: object, **bounds) -> float | Tensor:
    """A hyper-parameter that torch.optim also takes as a one-element tensor (lr, Adam's betas): a number is
    checked by ``check_hyper`` and returned as a float; a tensor must have one floating-point element, whose
    value is checked the same way (read once, here), and is returned as given (a scheduler fills it in place)."""
    if not isinstance(value, Tensor):
        return check_hyper(owner, name, value, **bounds)
    if value.numel() != 1 or not value.is_floating_point() or value.requires_grad:
        raise ValueError(f"{owner}: a tensor {name} must hold one floating-point element and not require grad "
                         f"(as torch.optim's), got shape {tuple(value.shape)}, dtype {value.dtype}, "
                         f"requires_grad={value.requires_grad}")
    check_hyper(owner, name, value.item(), **bounds)
    return value


def check_betas(owner: str, betas: object) -> tuple[float | Tensor, float | Tensor]:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{owner}: betas must be a pair (beta1, beta2), got {betas!r}")
    if isinstance(betas[0], Tensor) != isinstance(betas[1], Tensor):
        raise ValueError(f"{owner}: betas must be both numbers or both tensors, got {betas!r}")
    return (check_scalar_tensor(owner, "beta1 (betas[0])", betas[0], hi=1.0, hi_open=True),
            check_scalar_tensor(owner, "beta2 (betas[1])", betas[1], hi=1.0, hi_open=True))


def check_impl_flags(owner: str, foreach: object, differentiable: object, fused: object) -> dict:
    """torch.optim's implementation switches, accepted with torch's meaning (see the module docstring); returns
    them for the param_groups (torch.optim keeps them there too)."""
    if foreach not in (None, True, False):
        raise ValueError(f"{owner}: foreach must be None, True or False, got {foreach!r}")
    if differentiable is not False:
        raise ValueError(f"{owner}: differentiable={differentiable!r} is not supported: handgrad's update is written "
                         f"by hand with in-place kernels outside autograd, so no gradient flows through a step; "
                         f"use torch.optim.{owner} to differentiate through the optimizer")
    if fused not in (None, False):
        raise ValueError(f"{owner}: fused={fused!r} is not supported: handgrad's update is its hand-written foreach "
                         f"one (torch._foreach_* kernels), not a fused kernel; leave fused at None or False")
    return {"foreach": foreach, "differentiable": False, "fused": fused}


def number(x: float | Tensor) -> float:
    """A hyper-parameter's value as a Python number (a tensor's read back: the non-capturable paths only)."""
    return x.item() if isinstance(x, Tensor) else x


def _as_torch_param(p: object) -> Tensor:
    """A torch.Tensor parameter, or an engine Tensor's ``.data`` (where its gradient lives)."""
    if isinstance(p, Tensor):
        return p
    data = getattr(p, "data", None)
    if isinstance(data, Tensor):
        return data
    raise TypeError(f"optimizer params must be tensors, got {type(p).__name__}")


def scalar_step(param: Tensor, capturable: bool) -> Tensor:
    """A fresh ``step`` counter, placed and typed as torch.optim does: a 0-d float tensor (float64 under a
    float64 default dtype, else float32) on the CPU, or on ``param``'s device when ``capturable``."""
    dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    return torch.zeros((), dtype=dtype, device=param.device if capturable else "cpu")


class HandOptimizer(Optimizer):
    """Base class: ``step`` gathers the parameters that have a gradient and calls ``_update``.

    Parameters may be torch Tensors or autodiff engine Tensors (whose torch tensor ``.data``
    carries ``.grad``): the optimizer keeps and updates the torch tensor.
    """

    def add_param_group(self, param_group: dict) -> None:
        params = param_group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        param_group["params"] = [(p[0], _as_torch_param(p[1])) if isinstance(p, tuple) else _as_torch_param(p)
                                 for p in params]  # (name, tensor) pairs stay pairs, as torch.optim takes them
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        """One update.  ``closure`` (optional) re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        stepped = False
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            stepped = True
            grads = [p.grad for p in params]
            for p, g in zip(params, grads):
                if g.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                if g.shape != p.shape:
                    raise RuntimeError(f"{type(self).__name__}: a gradient has shape {tuple(g.shape)} but its "
                                       f"parameter has shape {tuple(p.shape)}")
            if group["maximize"]:
                grads = torch._foreach_neg(grads)
            self._update(group, params, grads)
        if not stepped:
            raise RuntimeError(f"{type(self).__name__}.step(): no parameter has a gradient (every .grad is None); "
                               f"call backward first")
        return loss

    @abstractmethod
    def _update(self, group: dict, params: list[Tensor], grads: list[Tensor]) -> None:
        """Apply the update to ``params`` in place; ``grads`` are already negated if maximize.

        Must not modify ``grads`` in place (they may be the parameters' own .grad tensors).
        """
