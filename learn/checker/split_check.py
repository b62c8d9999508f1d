"""Checking a learner's split backward (exercise linear_split): B then W, beside autograd and the fused backward.

On each configuration (N, D, H non-square; N = 1; H > D; a seeded random draw), twice: forward; B (``backward_input``)
with a random dout, whose dx is compared and after which ``.grad`` must be as it was; then the caller overwrites the
dout it gave (a pipeline reuses its receive buffer) and W (``backward_weight``) runs, whose ``.grad`` must hold the
gradients of the dout B received, added to the previous call's.  Beside it, a second object of the learner's class
runs the fused ``backward`` on the same tensors: B then W must equal it bit for bit (``torch.equal``).  Then one more
B and W with a new dout after the last forward (that dout's gradients, or a refusal: a B that changed what the
forward kept gives others); last, a W with no B before it must add nothing (or refuse).  Known mistakes are
replayed from the same tensors and named only when true (naming.matches).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import Tensor

from ..mistakes import CACHE_CHANGED, DOUBLED, DOUT_IN_PLACE, INPUT_IN_PLACE, OVERWRITE, Mistake
from .compare import RIGHT, describe, diagnose, rel_error, same
from .configs import current, stable_seed
from .guard import LearnerFailed
from .layer_check import AGAIN, CALLS, CONFIG, UNCHANGED, each_configuration, unchanged
from .naming import matches
from .report import Report
from .spec import normal, uniform
from .specs.linear import MISTAKES as LINEAR_MISTAKES

F64 = torch.float64
FORWARD, DX, B_GRAD = "forward: out", "B: dx", "B leaves .grad alone"
W_GRAD = "W: {} (from the dout B received)"
ACCUMULATE = "accumulation: a second B and W add into each .grad"
ONE_W = "one W per B: a W with no B before it adds nothing"
BITS = "B then W equal the fused backward bit for bit"
SHAPES = [("the default", 4, 5, 3), ("one example (N = 1)", 1, 5, 3), ("wide: N = 3, D = 2, H = 6", 3, 2, 6)]

DW_IN_B = Mistake(
    "split-dw-in-b",
    "dweight computed in B",
    "B is on the pipeline's critical path: the stage before waits for dx and nothing else.  dout.T @ x is W's work: "
    "B keeps dout (a copy) and x, and W computes dweight from them later, in what would have been a bubble",
)
GRAD_IN_B = Mistake(
    "split-grad-in-b",
    "changed by B",
    "B returns dx and leaves .grad alone: the weight gradients are added by W, later.  A .grad written in B is "
    "either added twice (once more by W) or added before the schedule says",
)
DOUT_NOT_KEPT = Mistake(
    "split-dout-not-kept",
    "the gradient of the dout as it was when W ran, not as B received it",
    "B kept a reference to the caller's dout, and the caller overwrote it before W (a pipeline receives the next "
    "micro-batch's gradient into the same buffer).  B must keep its own copy: self.pending = dout.clone()",
)
W_TWICE = Mistake(
    "split-w-twice",
    "changed by a second W with no B before it",
    "W must use up what B kept (self.pending = None once it is added): one W per B.  Run twice, yours added the same "
    "gradient again, so a schedule that runs W once more (or a retry) doubles .grad",
)
BIAS_FORGOTTEN = Mistake(
    "split-bias-forgotten",
    "None after W",
    "W adds both parameters' gradients: dweight = dout.T @ x into weight.grad and dbias = dout.sum(0) into bias.grad",
)
MISTAKES = [DW_IN_B, GRAD_IN_B, DOUT_NOT_KEPT, W_TWICE, BIAS_FORGOTTEN]
_FORMULAS = {
    "weight.grad": [m for m in LINEAR_MISTAKES if "weight" in m.key],
    "bias.grad": [m for m in LINEAR_MISTAKES if "bias" in m.key],
}


def _configs() -> list[tuple[str, int, int, int, int]]:
    """(label, N, D, H, seed) of each configuration: fixed, or drawn from a grader's per-student seed."""
    v = current()
    out = [(label, n, d, h, k if v is None else stable_seed(f"{v}:{k}")) for k, (label, n, d, h) in enumerate(SHAPES)]
    drawn = 1234 if v is None else stable_seed(f"{v}:random")
    n, d, h = (int(s) for s in torch.randint(1, 8, (3,), generator=torch.Generator().manual_seed(drawn)))
    return out + [(f"random shapes (seeded): N = {n}, D = {d}, H = {h}", n, d, h, drawn)]


def _expected(weight: Tensor, bias: Tensor, x: Tensor, dout: Tensor) -> dict[str, Tensor]:
    """out, dx, weight.grad and bias.grad of one forward and backward, from torch.autograd."""
    with torch.enable_grad():
        w, b, xx = (t.clone().requires_grad_() for t in (weight, bias, x))
        out = xx @ w.T + b
        dx, dw, db = torch.autograd.grad((out * dout).sum(), (xx, w, b))
    return {"out": out.detach(), "dx": dx, "weight.grad": dw, "bias.grad": db}


class LinearSplitSpec:
    name, cls = "linear_split", "Linear"
    mistakes = MISTAKES

    def planned(self) -> list[str]:
        configs = _configs()
        return [
            FORWARD,
            DX,
            B_GRAD,
            W_GRAD.format("weight.grad"),
            W_GRAD.format("bias.grad"),
            ACCUMULATE,
            AGAIN,
            UNCHANGED,
            ONE_W,
            BITS,
        ] + [CONFIG.format(k + 1, len(configs), c[0]) for k, c in enumerate(configs) if k]

    def check(self, box, where: str | None) -> Report:
        configs = _configs()
        report = Report(
            f"Checking {box.cls_name} of exercise linear_split on {len(configs)} configurations: B then W, "
            f"beside autograd and your class's fused backward"
        )
        report.right = (
            f"B then W equal your fused backward bit for bit, and B's dx and W's gradients agree with "
            f"PyTorch's autograd on all {len(configs)} configurations"
        )
        report.plan(*self.planned())

        def run(number: int, mark) -> bool:
            label, n, d, h, seed = configs[number]
            report.say(
                f"  configuration {number + 1} of {len(configs)}, {label}: {box.cls_name}(in_features={d}, "
                f"out_features={h}) on x ({n}, {d})"
            )
            return self._one(box, report, mark, n, d, h, seed)

        return each_configuration(report, [c[0] for c in configs], run)

    def _one(self, box, report: Report, mark, n: int, d: int, h: int, seed: int) -> bool:
        g = torch.Generator().manual_seed(seed)
        params = {"weight": uniform(g, h, d), "bias": normal(g, h, mean=0.5)}
        xs, douts, overwrite = ([normal(g, n, k) for _ in range(CALLS)] for k in (d, h, h))
        why = box.request("split_construct", {"in_features": d, "out_features": h}, params)
        if why is not None:
            report.fail("  " + why)
            return False
        total = {"weight.grad": None, "bias.grad": None}  # the expected .grad before each call
        for k in range(CALLS):
            want = _expected(params["weight"], params["bias"], xs[k], douts[k])
            out, x_after = box.request("split_forward", xs[k])
            if not unchanged({"x": x_after}, {"x": xs[k]}, report, mark, INPUT_IN_PLACE):
                return False
            if not _right("out", out, want["out"], FORWARD, report, mark, "forward is wrong.  "):
                return False
            dx, dout_after, grads_b, kept = box.request("split_b", douts[k])
            if not unchanged({"dout": dout_after}, {"dout": douts[k]}, report, mark, DOUT_IN_PLACE):
                return False
            if not _right("dx", dx, want["dx"], DX, report, mark, "B's dx is wrong.  "):
                report.say("  look at: dx = dout @ weight, (N, H) @ (H, D), as the fused backward computes it")
                return False
            where = _holds(kept, want["weight.grad"])
            if where:
                report.fail("  -> " + DW_IN_B.says(f"self.{where}", "holds"), DW_IN_B.key)
                mark(B_GRAD, False, [DW_IN_B.key])
                return False
            if not _grads_are(grads_b, total, GRAD_IN_B, B_GRAD, report, mark):
                return False
            try:
                grads_w = box.request("split_w", overwrite[k])
            except LearnerFailed as e:  # name what the failing line tried to add, when a mistake gives it
                report.fail(e.text, e.key)
                for pname, value in e.attempted.items():
                    self._name(
                        f"{pname}.grad",
                        value,
                        want[f"{pname}.grad"],
                        None,
                        want[f"{pname}.grad"],
                        xs[k],
                        douts[k],
                        overwrite[k],
                        0,
                        report,
                        quiet=True,
                    )
                return False
            for name in total:
                one = want[name]
                expected = one if total[name] is None else total[name] + one
                item = ACCUMULATE if k else W_GRAD.format(name)
                if not self._grad(
                    name,
                    grads_w.get(name),
                    expected,
                    total[name],
                    one,
                    xs[k],
                    douts[k],
                    overwrite[k],
                    k,
                    grads_w,
                    report,
                    mark,
                    item,
                ):
                    return False
                total[name] = expected
            dx_f, grads_f = box.request("split_fused", xs[k], douts[k])
            if not _fused(dx, dx_f, grads_w, grads_f, want, total, report, mark):
                return False
        if not self._again(box, report, mark, params, xs[-1], normal(g, n, h), normal(g, n, h), total):
            return False
        raised, grads_again = box.request("split_w_again")
        if not _grads_are(grads_again, total, W_TWICE, ONE_W, report, mark):
            return False
        report.say(
            "    right: B's dx and W's gradients agree with autograd over two calls, equal to the fused backward "
            "bit for bit" + (", and a W with no B refused" if raised else ", and a W with no B adds nothing")
        )
        return True

    def _again(self, box, report: Report, mark, params, x, dout, overwrite, total) -> bool:
        """AGAIN: one more B and W, with a new dout, after the last forward: that dout's dx, and its gradients added
        into .grad (``total`` is updated); or a refusal (an exception in B)."""
        want = _expected(params["weight"], params["bias"], x, dout)
        try:
            dx, _, _, _ = box.request("split_b", dout)
        except LearnerFailed as e:
            report.say(f"    a second B after one forward is refused ({e.text.strip().splitlines()[0].strip()}): fine")
            mark(AGAIN, True)
            return True
        grads = box.request("split_w", overwrite)
        for name in total:
            total[name] = total[name] + want[name]
        wrong = [
            n
            for n, a, w in [("dx", dx, want["dx"])] + [(n, grads.get(n), total[n]) for n in total]
            if not (isinstance(a, Tensor) and same(a, w, RIGHT))
        ]
        mark(AGAIN, not wrong)
        if wrong:
            n = wrong[0]
            mine = dx if n == "dx" else grads.get(n)
            report.fail(
                "  a second B and W after the same forward are wrong (the first were right).  "
                + describe(n, mine, want["dx"] if n == "dx" else total[n])
            )
            report.fail("  -> " + CACHE_CHANGED.says("B and W", "give"), CACHE_CHANGED.key)
        return not wrong

    def _grad(self, name, actual, expected, before, one, x, dout, overwritten, k, grads, report, mark, item) -> bool:
        """One .grad after W: right, or wrong with the mistake named when one fits."""
        if isinstance(actual, Tensor) and same(actual, expected, RIGHT):
            mark(item, True)
            return True
        mark(item, False)
        when = "" if k == 0 else " after the second B and W (a .grad must hold the sum of both calls')"
        if actual is None:
            other = "weight.grad" if name == "bias.grad" else "bias.grad"
            report.fail(
                f"  W is wrong{when}: {name} is None: W must add the gradient into self.{name} (creating it "
                f"when it is None)"
            )
            if name == "bias.grad" and grads.get(other) is not None:
                report.fail("  -> " + BIAS_FORGOTTEN.says(name, "is"), BIAS_FORGOTTEN.key)
            return False
        report.fail(f"  W is wrong{when}.  " + describe(name, actual, expected))
        self._name(name, actual, expected, before, one, x, dout, overwritten, k, report)
        return False

    def _name(self, name, actual, expected, before, one, x, dout, overwritten, k, report, quiet=False) -> None:
        """The known mistake that gives ``actual``, if one does; else (unless ``quiet``) what the difference looks
        like."""
        base = 0 if before is None else before
        if name == "weight.grad":
            replays = [(DOUT_NOT_KEPT, base + overwritten.T @ x)]
        else:
            replays = [(DOUT_NOT_KEPT, base + overwritten.sum(0))]
        ctx = SimpleNamespace(x=x, dout=dout)
        replays += [(m, _plus(base, m.value(ctx)[name])) for m in _FORMULAS[name]]
        replays += [(DOUBLED, 2 * one)] if k == 0 else [(OVERWRITE, one)]
        for m, value in replays:
            if value is not None and matches(actual, value, expected):
                report.fail("  -> " + m.says(name), m.key)
                return
        if quiet:
            return
        for line in diagnose(name, actual, expected, {}):
            report.say("  -> " + line)
        report.say(
            "  look at: W's dweight = dout.T @ x, from the dout B kept"
            if name == "weight.grad"
            else "  look at: W's dbias = dout.sum(0), from the dout B kept"
        )


def _plus(base, t: Tensor):
    """base + t, or None where a wrong formula's shape cannot be added (it cannot be the learner's .grad then)."""
    if isinstance(base, Tensor) and base.shape != t.shape:
        return None
    return base + t


def _holds(kept, t: Tensor, path: str = "") -> str:
    """Where what B kept (attributes: tensors, or tuples, lists or dicts of them) holds ``t``; "" if nowhere."""
    if isinstance(kept, Tensor):
        return path if kept.shape == t.shape and same(kept, t, RIGHT) else ""
    items = kept.items() if isinstance(kept, dict) else enumerate(kept) if isinstance(kept, (list, tuple)) else ()
    for key, value in items:
        sub = (f"{path}.{key}" if path else str(key)) if isinstance(kept, dict) else f"{path}[{key}]"
        found = _holds(value, t, sub)
        if found:
            return found
    return ""


def _grads_are(grads: dict, total: dict, mistake: Mistake, item: str, report: Report, mark) -> bool:
    """Each .grad as ``total`` says it must be by now (None: none yet); else ``mistake`` named and ``item`` failed."""
    for name, expected in total.items():
        if not _same_or_none(grads.get(name), expected):
            report.fail("  -> " + mistake.says(name, "was"), mistake.key)
            mark(item, False, [mistake.key])
            return False
    mark(item, True)
    return True


def _same_or_none(actual, expected) -> bool:
    """``actual`` is ``expected``; where that is None (no gradient yet), None or zeros (a .grad created, nothing
    added) will do."""
    if expected is None:
        return actual is None or isinstance(actual, Tensor) and not actual.any()
    return isinstance(actual, Tensor) and actual.shape == expected.shape and same(actual, expected, RIGHT)


def _right(name: str, actual, expected: Tensor, item: str, report: Report, mark, lead: str) -> bool:
    if isinstance(actual, Tensor) and type(actual) is Tensor and same(actual, expected, RIGHT):
        mark(item, True)
        return True
    mark(item, False)
    report.fail("  " + lead + describe(name, actual, expected))
    if isinstance(actual, Tensor):
        for line in diagnose(name, actual, expected, {}):
            report.say("  -> " + line)
    return False


def _fused(dx, dx_f, grads_w, grads_f, want, total, report: Report, mark) -> bool:
    """B then W against the fused backward of another object of the learner's class: the same bits."""
    pairs = [("dx", dx, dx_f, want["dx"])] + [(n, grads_w[n], grads_f.get(n), total[n]) for n in total]
    for name, split, fused, expected in pairs:
        if not (isinstance(fused, Tensor) and same(fused, expected, RIGHT)):
            report.fail(
                "  your class's fused backward() (given) is wrong: "
                + describe(name, fused, expected)
                + ".  Restore it from python -m learn start linear_split --solution"
            )
            mark(BITS, False)
            return False
        if not torch.equal(split, fused):
            err = rel_error(split, fused)
            report.fail(
                f"  B then W give {name} within {err:.1e} of the fused backward's, not bit for bit: the split "
                f"must run the fused backward's own operations on the same tensors (dout @ weight, dout.T @ x, "
                f"dout.sum(0)); a reordered or differently associated product changes the rounding"
            )
            mark(BITS, False)
            return False
    mark(BITS, True)
    return True
