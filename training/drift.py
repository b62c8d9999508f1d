"""How far the implementations of a run drift apart while it trains, and how closely their first step agrees.

In float32 the hand-written model and its twin compute the same step to rounding, but rounding differences grow
over thousands of steps, the way they do between any two runs that sum in another order: the largest weight
difference after an epoch can be 0.2 while the first step's gradients agree to 1e-7.  ``Drift`` records both
in metrics.jsonl (records of type "drift"): the largest |a - b| over every weight and buffer, between each
implementation and the first, at steps 1, 4, 16, 64, ... of the first epoch and at each epoch's end, and at
step 1 the largest relative difference of the gradients, max|g_a - g_b| / max|g_b| per parameter.

The implementations train one after another within an epoch, so their weights at the same step exist at
different times: at the steps inside the first epoch the first implementation's weights are kept (a copy) until
the others reach that step.  At an epoch's end every implementation has finished it, so they are compared as
they are.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .impls import Impl, grads_state, max_param_abs_diff, weights_state

_GROWTH = 4  # steps 1, 4, 16, 64, ... of the first epoch: the drift grows roughly exponentially


def _largest_abs_diff(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    diffs = [(a[k].double() - v.double()).abs().max() for k, v in b.items() if v.is_floating_point() and v.numel()]
    return torch.stack(diffs).max().item()


def _largest_rel_diff(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """max over parameters of max|a - b| / max(max|a|, max|b|), as gradcheck.py measures."""
    rels = []
    for k, g in b.items():
        x, y = a[k].double(), g.double()
        rels.append((x - y).abs().max() / torch.maximum(x.abs().max(), y.abs().max()).clamp_min(1e-300))
    return torch.stack(rels).max().item()


class Drift:
    """Logs "drift" records through ``log``: call ``after_step`` after every training step of every
    implementation, ``end_epoch`` once all of them finished an epoch."""

    def __init__(self, impls: dict[str, Impl], steps_per_epoch: int, log: Callable[[dict], None]):
        self.impls, self.names, self.log = impls, list(impls), log
        within = (_GROWTH ** k for k in range(steps_per_epoch.bit_length()))
        self.probes = {1} | {step for step in within if step < steps_per_epoch}
        self.kept: dict[int, tuple[dict, dict]] = {}  # step -> the first implementation's weights and gradients
        self.pending: dict[int, dict] = {}  # step -> its record, until the last implementation reaches the step
        self.step = 0  # the latest step any implementation took

    def after_step(self, impl: Impl, step: int) -> None:
        self.step = step
        if step not in self.probes:
            return
        grads = grads_state(impl) if step == 1 else {}
        if impl.name == self.names[0]:
            self.kept[step] = ({k: v.detach().clone() for k, v in weights_state(impl).items()},
                               {k: g.clone() for k, g in grads.items()})
            return
        if step not in self.kept:  # a run resumed within the probed steps (it cannot be: checkpoints end epochs)
            return
        weights, first_grads = self.kept[step]
        rec = self.pending.setdefault(step, {"type": "drift", "epoch": 1, "step": step, "impls": self.names,
                                             "max_param_abs_diff": 0.0})
        rec["max_param_abs_diff"] = max(rec["max_param_abs_diff"], _largest_abs_diff(weights, weights_state(impl)))
        if grads:
            rec["max_grad_rel_diff"] = max(rec.get("max_grad_rel_diff", 0.0), _largest_rel_diff(first_grads, grads))
        if impl.name == self.names[-1]:
            del self.kept[step]
            self.log(self.pending.pop(step))

    def end_epoch(self, epoch: int) -> float:
        """Log and return the largest weight difference now, when every implementation has finished ``epoch``."""
        diff = max_param_abs_diff(self.impls)
        self.log({"type": "drift", "epoch": epoch, "step": self.step, "impls": self.names, "max_param_abs_diff": diff})
        return diff


def first_step_agreement(records: list[dict]) -> float | None:
    """The first step's largest relative gradient difference, from a run's records (None if not recorded)."""
    return next((r["max_grad_rel_diff"] for r in records if r["type"] == "drift" and "max_grad_rel_diff" in r), None)
