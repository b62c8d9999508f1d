"""Checking a learner's optimizer: several steps beside torch.optim's on the same gradients, the mistake named, and
when none fits, the right update's quantities at the entry that differs, to compare with the learner's own.

Two parameters, (3, 5) and (4,), six steps, hyperparameters away from the defaults (each variant of the
hyperparameters a run of its own: SGD without momentum, with it, with Nesterov's).  The second parameter's
gradients are tiny (about 1e-9): there an eps in the wrong place changes the step by orders of magnitude.  Each
exercise writes its update once (``replay``) with switches that make its known mistakes; a mistake is named only
when its replay gives the learner's parameters at every step so far and the right update does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..mistakes import Mistake
from .compare import RIGHT, SAME, describe, rel_error, same, worst
from .guard import LearnerFailed
from .report import Report

STEPS = 6


def problem():
    """The parameters and each step's gradients: from seed 0, or from a grader's per-student seed (configs.py)."""
    from .configs import current

    g = torch.Generator().manual_seed(current() or 0)
    params = [torch.randn(3, 5, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)]
    grads = [
        [
            torch.randn(3, 5, generator=g, dtype=torch.float64) * (1 + s),
            torch.randn(4, generator=g, dtype=torch.float64) * 1e-9,
        ]
        for s in range(STEPS)
    ]
    return params, grads


@dataclass
class OptimizerSpec:
    name: str
    cls: str
    torch_class: Callable  # torch.optim's optimizer: torch_class(params, **hyper)
    replay: Callable  # replay(params, grads, hyper, trace=None, **switches) -> the parameters after each step
    variants: list[tuple[str, dict]]  # (label, hyperparameters): the first is the default run, step by step
    known: list[tuple[Mistake, dict]] = field(default_factory=list)  # each mistake and the switches that make it
    update: str = ""  # the right update in one line, for the report

    @property
    def mistakes(self) -> list[Mistake]:
        seen, out = set(), []
        for m, _ in self.known:
            if m.key not in seen:
                seen.add(m.key)
                out.append(m)
        return out

    def planned(self) -> list[str]:
        return [f"step {s + 1}" for s in range(STEPS)] + [f"{label}: {STEPS} steps" for label, _ in self.variants[1:]]

    def check(self, box, where: str | None) -> Report:
        """``box``: the Sandbox running the learner's optimizer; its steps run there, torch.optim's here."""
        label, hyper = self.variants[0]
        shown = ", ".join(f"{k}={v}" for k, v in hyper.items())
        ref = self.torch_class.__name__
        report = Report(
            f"Checking {box.cls_name}(params, {shown}) of exercise {self.name}: {STEPS} steps on "
            f"parameters (3, 5) and (4,), beside torch.optim.{ref}"
            + (f", then {len(self.variants) - 1} more setting(s)" if len(self.variants) > 1 else "")
        )
        report.right = f"every parameter agrees with torch.optim.{ref}'s after every step"
        report.plan(*self.planned())
        told = False
        for k, (label, hyper) in enumerate(self.variants):
            sub = report if not told else Report("")
            if k:
                sub.say(f"  with {label} ({', '.join(f'{a}={b}' for a, b in hyper.items())}):")
            try:
                ok = self._steps(box, sub, hyper, mark=report.mark if k == 0 else None)
            except LearnerFailed as e:
                sub.fail(e.text, e.key)
                ok = False
            if k:
                report.mark(f"{label}: {STEPS} steps", ok)
            if not ok:
                report.passed = False
                told = True
        report.settle()
        return report

    def _steps(self, box, report: Report, hyper: dict, mark) -> bool:
        params, grads = problem()
        theirs = [p.clone().requires_grad_() for p in params]
        ref = self.torch_class(theirs, **hyper)
        mine_history, failed = box.request("adam_run", params, grads, hyper)  # any optimizer: cls(params, **hyper)
        for s, gs in enumerate(grads):
            for q, g in zip(theirs, gs, strict=True):
                q.grad = g.clone()
            ref.step()
            if s == len(mine_history):
                text, key = failed
                raise LearnerFailed(text, key=key)
            for j, (p, q) in enumerate(zip(mine_history[s], theirs, strict=True)):
                if same(p, q.detach(), RIGHT):
                    continue
                if mark:
                    mark(f"step {s + 1}", False)
                report.fail(
                    f"  step {s + 1}, parameter {j} {tuple(q.shape)} is wrong.  "
                    + describe(f"params[{j}]", p, q.detach())
                )
                self._name(params, grads, hyper, mine_history, s, j, report)
                return False
            if mark:
                mark(f"step {s + 1}", True)
        report.say(
            f"    every parameter equal to torch.optim.{self.torch_class.__name__}'s after each of {STEPS} steps"
        )
        return True

    def _name(self, params, grads, hyper, mine_history, s: int, j: int, report) -> None:
        """Name the mistake whose replay is clearly closer to the learner's steps than the right steps are, on every
        step the learner's optimizer took (two mistakes can agree on the first); else give the right update's
        quantities at the entry that differs most."""
        steps = len(mine_history)
        trace: dict = {}
        right = self.replay(params, grads[:steps], hyper, trace=trace)

        def gap(xs, ys):  # a nan where the other has one too counts as equal (t = 0 gives nan at once)
            worst_gap = 0.0
            for got, want in zip(xs, ys, strict=True):
                for p, q in zip(got, want, strict=True):
                    bad = ~torch.isfinite(p)
                    if not torch.equal(bad, ~torch.isfinite(q)):
                        return float("inf")
                    worst_gap = max(worst_gap, rel_error(p.masked_fill(bad, 0.0), q.masked_fill(bad, 0.0)))
            return worst_gap

        to_right = gap(mine_history, right)
        for m, switches in self.known:
            try:
                history = self.replay(params, grads[:steps], hyper, **switches)
            except Exception:
                continue
            to_mistake = gap(mine_history, history)
            if gap(history, right) > 10 * RIGHT and to_mistake < SAME and to_mistake < 0.01 * to_right:
                report.fail("  -> " + m.says("steps", "match"), m.key)
                return
        if to_right < 1e-4:
            report.say(
                f"  -> close but not right (relative error {to_right:.1e}): float32 somewhere; "
                f"torch.zeros(shape) makes float32 (use zeros_like(p), or dtype=torch.float64)"
            )
        elif any(not torch.isfinite(p).all() for p in mine_history[-1]):
            report.say("  -> nan or inf: a division by zero, or a square root of a negative number")
        report.say("  -> no known mistake gives these numbers; compare your update with the right one:")
        report.say(f"     {self.update}")
        mine, want = mine_history[s][j], right[s][j]
        index = worst(mine, want)[0] if mine.shape == want.shape else ()
        before = params[j] if s == 0 else right[s - 1][j]
        at = f"params[{j}][{', '.join(map(str, index))}]" if index else f"params[{j}]"
        quantities = trace.get((s, j), {})
        report.say(
            f"     at step {s + 1}, {at}: "
            + ", ".join(f"{name} = {value[index].item():.10g}" for name, value in quantities.items())
        )
        mine_before = params[j] if s == 0 else mine_history[s - 1][j]
        if mine.shape == want.shape and mine_before.shape == mine.shape:
            report.say(
                f"     the right step moves it by {(want - before)[index].item():.10g}; yours by "
                f"{(mine - mine_before)[index].item():.10g} (print your quantities at that entry)"
            )
