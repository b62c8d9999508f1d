"""Checking a learner's Adam: several steps beside torch.optim.Adam on the same gradients, and the mistake named.

Two parameters, (3, 5) and (4,), six steps, hyperparameters away from the defaults.  The second parameter's
gradients are tiny (about 1e-9): there sqrt(v_hat) is about 1e-9, smaller than eps = 1e-8, so an eps in the
wrong place changes the step by orders of magnitude.  Known mistakes are replayed by ``_adam`` with switches.
"""
from __future__ import annotations

import torch

from ..mistakes import Mistake
from .compare import RIGHT, SAME, describe, rel_error, same
from .guard import LearnerFailed
from .report import Report

STEPS = 6
HYPER = {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-8}


def _problem():
    """The parameters and each step's gradients: from seed 0, or from a grader's per-student seed (configs.py)."""
    from .configs import current
    g = torch.Generator().manual_seed(current() or 0)
    params = [torch.randn(3, 5, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)]
    grads = [[torch.randn(3, 5, generator=g, dtype=torch.float64) * (1 + s),
              torch.randn(4, generator=g, dtype=torch.float64) * 1e-9] for s in range(STEPS)]
    return params, grads


def _adam(params, grads, bias_correction=True, eps_inside=False, state_reset=False, t_fixed=False,
          betas_swapped=False, uphill=False, in_place=True, t_from_zero=False, shared_state=False):
    """The parameters after each step, under the given mistakes (none by default)."""
    lr, (b1, b2), eps = HYPER["lr"], HYPER["betas"], HYPER["eps"]
    if betas_swapped:
        b1, b2 = b2, b1
    ps = [p.clone() for p in params]
    m, v = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    history = []
    for t, gs in enumerate(grads, start=1):
        t = 1 if t_fixed else t - 1 if t_from_zero else t
        for j, (p, g) in enumerate(zip(ps, gs)):
            if state_reset:
                m[j], v[j] = torch.zeros_like(p), torch.zeros_like(p)
            m[j] = b1 * m[j] + (1 - b1) * g
            v[j] = b2 * (m[j] if shared_state else v[j]) + (1 - b2) * g * g
            if shared_state:  # m and v are one tensor: the second update overwrote the first
                m[j] = v[j]
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
    (Mistake("adam-t-from-zero", "the bias correction with t counted from 0 (t += 1 after the step)",
             "at the first step t must be 1: with t = 0, 1 - beta**t is 0 and m_hat = m / 0 (inf, then nan).  Add 1 "
             "to t at the start of step()"), {"t_from_zero": True}),
    (Mistake("adam-shared-state", "m and v one and the same list of tensors (self.m = self.v = [...])",
             "a = b = [...] makes one list with two names: m and v must be separate tensors, each its own "
             "torch.zeros_like(p)"), {"shared_state": True}),
    (Mistake("adam-uphill", "p += lr * m_hat / (sqrt(v_hat) + eps)",
             "a step goes against the gradient, downhill: p -= ..."), {"uphill": True}),
    (Mistake("adam-not-in-place", "parameters that never change",
             "p = p - ... makes a new tensor and rebinds the name p; the model still holds the old one.  Change the "
             "tensor itself: p -= ..., or p.sub_(...)"), {"in_place": False}),
]


class AdamSpec:
    name, cls = "adam", "Adam"
    mistakes = [m for m, _ in MISTAKES]

    def planned(self) -> list[str]:
        return [f"step {s + 1}" for s in range(STEPS)]

    def check(self, box, where: str | None) -> Report:
        """``box``: the Sandbox running the learner's Adam; its steps run there, torch.optim.Adam's here."""
        report = Report(f"Checking {box.cls_name}(params, lr={HYPER['lr']}, betas={HYPER['betas']}, "
                        f"eps={HYPER['eps']}) of exercise adam: {STEPS} steps on parameters (3, 5) and (4,), beside "
                        f"torch.optim.Adam")
        report.right = "every parameter agrees with torch.optim.Adam's after every step"
        report.plan(*self.planned())
        try:
            self._steps(box, report)
        except LearnerFailed as e:
            report.fail(e.text, e.key)
        report.settle()
        return report

    def _steps(self, box, report: Report) -> None:
        params, grads = _problem()
        theirs = [p.clone().requires_grad_() for p in params]
        ref = torch.optim.Adam(theirs, **HYPER)
        mine_history, failed = box.request("adam_run", params, grads, HYPER)
        for s, gs in enumerate(grads):
            for q, g in zip(theirs, gs):
                q.grad = g.clone()
            ref.step()
            if s == len(mine_history):
                text, key = failed
                raise LearnerFailed(text, key=key)
            for j, (p, q) in enumerate(zip(mine_history[s], theirs)):
                if same(p, q.detach(), RIGHT):
                    continue
                report.mark(f"step {s + 1}", False)
                report.fail(f"  step {s + 1}, parameter {j} {tuple(q.shape)} is wrong.  "
                            + describe(f"params[{j}]", p, q.detach()))
                self._name(params, grads, mine_history[:s + 1], report)
                return
            report.mark(f"step {s + 1}", True)
        report.say(f"  every parameter equal to torch.optim.Adam's after each of {STEPS} steps")

    def _name(self, params, grads, mine_history, report):
        """Name the mistake whose replay is clearly closer to the learner's steps than the right steps are."""
        steps = len(mine_history)
        right = _adam(params, grads[:steps])

        def gap(xs, ys):  # a nan where the other has one too counts as equal (t = 0 gives nan at once)
            worst = 0.0
            for got, want in zip(xs, ys):
                for p, q in zip(got, want):
                    bad = ~torch.isfinite(p)
                    if not torch.equal(bad, ~torch.isfinite(q)):
                        return float("inf")
                    worst = max(worst, rel_error(p.masked_fill(bad, 0.0), q.masked_fill(bad, 0.0)))
            return worst
        to_right = gap(mine_history, right)
        for m, switches in MISTAKES:
            history = _adam(params, grads[:steps], **switches)
            to_mistake = gap(mine_history, history)
            if gap(history, right) > 10 * RIGHT and to_mistake < SAME and to_mistake < 0.01 * to_right:
                report.fail("  -> " + m.says("steps", "match"), m.key)
                return
        if to_right < 1e-4:
            report.say(f"  -> close but not right (relative error {to_right:.1e}): float32 somewhere; "
                       f"torch.zeros(shape) makes float32 (use zeros_like(p), or dtype=torch.float64)")
        elif any(not torch.isfinite(p).all() for p in mine_history[-1]):
            report.say("  -> nan or inf: a division by zero; is t counted from 1 at the first step (1 - beta**t is 0 "
                       "at t = 0)?")
        report.say("  -> no known mistake gives these numbers; compare your step with the docstring's five lines, "
                   "one at a time (print m, v, m_hat, v_hat after step 1)")
