"""Checking a learner's Adam: several steps beside torch.optim.Adam on the same gradients, and the mistake named.

Two parameters, (3, 5) and (4,), six steps, hyperparameters away from the defaults.  The second parameter's
gradients are tiny (about 1e-9): there sqrt(v_hat) is about 1e-9, smaller than eps = 1e-8, so an eps in the
wrong place changes the step by orders of magnitude.  Known mistakes are replayed by ``_adam`` with switches.
"""
from __future__ import annotations

import torch

from ..mistakes import Mistake
from .compare import RIGHT, describe, same
from .guard import LearnerFailed, call
from .report import Report

STEPS = 6
HYPER = {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-8}


def _problem():
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(3, 5, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)]
    grads = [[torch.randn(3, 5, generator=g, dtype=torch.float64) * (1 + s),
              torch.randn(4, generator=g, dtype=torch.float64) * 1e-9] for s in range(STEPS)]
    return params, grads


def _adam(params, grads, bias_correction=True, eps_inside=False, state_reset=False, t_fixed=False,
          betas_swapped=False, uphill=False, in_place=True):
    """The parameters after each step, under the given mistakes (none by default)."""
    lr, (b1, b2), eps = HYPER["lr"], HYPER["betas"], HYPER["eps"]
    if betas_swapped:
        b1, b2 = b2, b1
    ps = [p.clone() for p in params]
    m, v = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    history = []
    for t, gs in enumerate(grads, start=1):
        t = 1 if t_fixed else t
        for j, (p, g) in enumerate(zip(ps, gs)):
            if state_reset:
                m[j], v[j] = torch.zeros_like(p), torch.zeros_like(p)
            m[j] = b1 * m[j] + (1 - b1) * g
            v[j] = b2 * v[j] + (1 - b2) * g * g
            mh, vh = (m[j] / (1 - b1 ** t), v[j] / (1 - b2 ** t)) if bias_correction else (m[j], v[j])
            step = lr * mh / ((vh + eps).sqrt() if eps_inside else vh.sqrt() + eps)
            if in_place:
                p += step if uphill else -step
        history.append([p.clone() for p in ps])
    return history


MISTAKES = [
    (Mistake("adam-no-bias-correction", "Adam without bias correction (m and v used as they are)",
             "m and v start at 0, so early on they are too small by (1 - beta1^t) and (1 - beta2^t): divide them by "
             "those before the step"), {"bias_correction": False}),
    (Mistake("adam-eps-inside-sqrt", "lr * m_hat / sqrt(v_hat + eps)",
             "eps is added after the square root: m_hat / (sqrt(v_hat) + eps).  Inside, it swamps a small v_hat: "
             "with gradients near 1e-9 the step shrinks ten thousand times"), {"eps_inside": True}),
    (Mistake("adam-state-reset", "m and v started from zero at every step",
             "m and v are running averages: keep them between steps (create them once, in __init__ or at the first "
             "step)"), {"state_reset": True}),
    (Mistake("adam-t-not-incremented", "the bias correction of step 1 at every step",
             "t counts the steps taken: add 1 at each step() before the bias corrections"), {"t_fixed": True}),
    (Mistake("adam-betas-swapped", "beta2 for the gradient's average and beta1 for its square's",
             "betas = (beta1, beta2): beta1 (0.9) averages the gradient into m, beta2 (0.999) its square into v"),
     {"betas_swapped": True}),
    (Mistake("adam-uphill", "p += lr * m_hat / (sqrt(v_hat) + eps)",
             "a step goes against the gradient, downhill: p -= ..."), {"uphill": True}),
    (Mistake("adam-not-in-place", "parameters that never change",
             "p = p - ... makes a new tensor and rebinds the name p; the model still holds the old one.  Change the "
             "tensor itself: p -= ..., or p.sub_(...)"), {"in_place": False}),
]


class AdamSpec:
    name, cls = "adam", "Adam"
    mistakes = [m for m, _ in MISTAKES]

    def check(self, cls: type, where: str | None) -> Report:
        report = Report(f"Checking {cls.__name__}(params, lr={HYPER['lr']}, betas={HYPER['betas']}, "
                        f"eps={HYPER['eps']}) of exercise adam: {STEPS} steps on parameters (3, 5) and (4,), beside "
                        f"torch.optim.Adam")
        report.right = "every parameter agrees with torch.optim.Adam's after every step"
        try:
            self._steps(cls, where, report)
        except LearnerFailed as e:
            report.fail(e.text, e.key)
        return report

    def _steps(self, cls: type, where: str | None, report: Report) -> None:
        params, grads = _problem()
        theirs = [p.clone().requires_grad_() for p in params]
        ref = torch.optim.Adam(theirs, **HYPER)
        mine = [p.clone() for p in params]
        opt = call(f"{cls.__name__}(params, ...)", lambda: cls(mine, **HYPER), where=where)
        mine_history = []
        for s, gs in enumerate(grads):
            for p, q, g in zip(mine, theirs, gs):
                p.grad, q.grad = g.clone(), g.clone()
            ref.step()
            call(f"{cls.__name__}.step", opt.step, where=where)
            mine_history.append([p.clone() for p in mine])
            for j, (p, q) in enumerate(zip(mine, theirs)):
                if same(p, q.detach(), RIGHT):
                    continue
                report.fail(f"  step {s + 1}, parameter {j} {tuple(p.shape)} is wrong.  "
                            + describe(f"params[{j}]", p, q.detach()))
                self._name(params, grads, mine_history, report)
                return
        report.say(f"  every parameter equal to torch.optim.Adam's after each of {STEPS} steps")

    def _name(self, params, grads, mine_history, report):
        steps = len(mine_history)
        for m, switches in MISTAKES:
            history = _adam(params, grads[:steps], **switches)
            if all(same(p, q) for got, want in zip(mine_history, history) for p, q in zip(got, want)):
                report.fail("  -> " + m.says("steps", "match"), m.key)
                return
        report.say("  -> no known mistake gives these numbers; compare your step with the docstring's five lines, "
                   "one at a time (print m, v, m_hat, v_hat after step 1)")
