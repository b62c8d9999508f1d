"""How far the implementations of a run drift apart while it trains, and how closely their first step agrees.

In float32 the hand-written model and its twin compute the same step to rounding, but rounding differences grow
over thousands of steps, the way they do between any two runs that sum in another order: the largest weight
difference after an epoch can be 0.2 while the first step's gradients agree to 1e-7.  ``Drift`` records both
in metrics.jsonl (records of type "drift"): the largest |a - b| over every weight and buffer, between each
implementation and the first, at steps 1, 4, 16, 64, ... of the first epoch and at each epoch's end, and at
step 1 the largest relative difference of the logits (the forward: 0 when it agrees bit for bit) and of the
gradients, max|g_a - g_b| / max|g_b| per parameter.

The implementations train one after another within an epoch, so their weights at the same step exist at
different times: at the steps inside the first epoch the first implementation's weights are kept (a copy) until
the others reach that step.  At an epoch's end every implementation has finished it, so they are compared as
they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor

from .config.run import RunConfig
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
        within = (_GROWTH**k for k in range(steps_per_epoch.bit_length()))
        self.probes = {1} | {step for step in within if step < steps_per_epoch}
        self.kept: dict[int, tuple] = {}  # step -> the first implementation's weights, gradients and logits
        self.pending: dict[int, dict] = {}  # step -> its record, until the last implementation reaches the step
        self.step = 0  # the latest step any implementation took

    def after_step(self, impl: Impl, step: int, logits: Tensor | None = None) -> None:
        """After ``impl``'s training step ``step``, which computed ``logits`` (None where a step does not return
        them whole: a model-parallel one)."""
        self.step = step
        if step not in self.probes:
            return
        grads = grads_state(impl) if step == 1 else {}
        logits = logits.detach().clone() if step == 1 and logits is not None else None
        if impl.name == self.names[0]:
            self.kept[step] = (
                {k: v.detach().clone() for k, v in weights_state(impl).items()},
                {k: g.clone() for k, g in grads.items()},
                logits,
            )
            return
        if step not in self.kept:  # a run resumed within the probed steps (it cannot be: checkpoints end epochs)
            return
        weights, first_grads, first_logits = self.kept[step]
        rec = self.pending.setdefault(
            step, {"type": "drift", "epoch": 1, "step": step, "impls": self.names, "max_param_abs_diff": 0.0}
        )
        rec["max_param_abs_diff"] = max(rec["max_param_abs_diff"], _largest_abs_diff(weights, weights_state(impl)))
        if grads:
            rec["max_grad_rel_diff"] = max(rec.get("max_grad_rel_diff", 0.0), _largest_rel_diff(first_grads, grads))
        if logits is not None and first_logits is not None:
            rel = _largest_rel_diff({"logits": first_logits}, {"logits": logits})
            rec["logits_rel_diff"] = max(rec.get("logits_rel_diff", 0.0), rel)
        if impl.name == self.names[-1]:
            del self.kept[step]
            self.log(self.pending.pop(step))

    def end_epoch(self, epoch: int) -> float:
        """Log and return the largest weight difference now, when every implementation has finished ``epoch``."""
        diff = cast(float, max_param_abs_diff(self.impls))  # a number: a Drift compares two implementations or more
        self.log({"type": "drift", "epoch": epoch, "step": self.step, "impls": self.names, "max_param_abs_diff": diff})
        return diff


MIXED_DRIFT = (
    " (mixed precision: float32 weights of two runs that may round their half products differently, "
    "not expected to agree to float32 precision)"
)


def drift_note(run: RunConfig) -> str:
    """Why the weights of implementations that agree step by step move apart, for the line that prints it."""
    if run.is_mixed:
        return MIXED_DRIFT
    note = f" ({run.dtype} rounding, which training amplifies as between two runs that sum in another order"
    return note + ("; --dtype float64 delays it)" if run.dtype == "float32" else ")")


# float64 rounding moves a first step's weights apart by about 1e-17 (ulps of the weights); a difference of 1e4 ulps
# of 1 (2.2e-12) is a different computation, such as bias corrections taken in float32 (7e-10 at lr 1e-3).
FLOAT64_ROUNDING = 1e4 * torch.finfo(torch.float64).eps


def agreement(run: RunConfig, records: list) -> str | None:
    """What "the implementations agree" means beside the largest weight difference: how closely the run's first
    step agreed (the forward, by its logits; the gradients; the weights after the update) and why the weights drift
    apart later.  It is put down to rounding only where the first step's weights agree to rounding (checked in
    float64, where that is sharp: in float32 a gradient near zero whose sign rounds differently moves an Adam
    weight by up to ~0.2 lr)."""
    first = next((r for r in records if r["type"] == "drift" and "max_grad_rel_diff" in r), None)
    if first is None:  # resumed from a checkpoint of a version that did not record it
        return None
    logits, moved = first.get("logits_rel_diff"), first.get("max_param_abs_diff")
    forward = (
        ""
        if logits is None
        else "its forward bit for bit (equal logits), "
        if logits == 0.0
        else f"its logits to {logits:.1e} (largest relative difference), "
    )
    line = (
        f"  in {run.dtype}, agreeing means: the first step agreed, {forward}its gradients to "
        f"{first['max_grad_rel_diff']:.1e} (largest relative difference)"
    )
    if moved is not None:
        line += f" and its updated weights to {moved:.1e} (largest difference)"
    if run.is_mixed:
        return line
    if run.dtype == "float64" and moved is not None and moved > FLOAT64_ROUNDING:
        return line + (
            f": more than float64 rounding explains ({FLOAT64_ROUNDING:.1e}), so the implementations' "
            f"steps compute different numbers (an optimizer's precision, a different update), not "
            f"only in another order"
        )
    eps = torch.finfo(run.torch_dtype).eps
    line += (
        f": {run.dtype} rounding (its unit is {eps:.1e}), which every later update amplifies, as it would "
        f"between two runs that sum in another order, so the weights drift apart"
    )
    if run.dtype == "float32":
        line += (
            f" (--dtype float64 starts from its rounding, {torch.finfo(torch.float64).eps:.1e}, and delays the "
            f"drift by epochs, not for good)"
        )
    return line + ("; curves.png plots the drift over steps" if run.plots else "")
