"""Checking a learner's Value engine: expressions that isolate each operation, nodes used twice, diamonds, a deep chain.

Each expression runs three times: on the learner's Value, on 0-d float64 torch tensors (autograd gives the
expected gradients), and on ``value_engine.RefValue`` under each known mistake's switches, to name it.  The
leaves a = 0.8 and b = -1.7 keep every mistake visible (tanh'(a) != 1 - a**2, a != 1, ...).
"""

from __future__ import annotations

import torch

from ..mistakes import Mistake
from .guard import LearnerFailed
from .report import Report
from .value_engine import Switches, engine
from .value_expressions import EXPRESSIONS, A, B, deep
from .value_expressions import run as _run

_WALK = (
    "the graph was walked out of topological order: a node's _backward ran before every node that uses it "
    "had added its share to its .grad, so that share never reached the nodes before it.  Sort the nodes "
    "topologically (each after everything in its _prev) and call _backward from the output back"
)
MISTAKES = [  # (the mistake, the switches of value_engine that make it)
    (
        Mistake("value-walk-preorder", "a depth-first walk calling _backward as each node is first reached", _WALK),
        Switches(walk="preorder"),
    ),
    (
        Mistake(
            "value-walk-preorder",
            "a depth-first walk calling _backward in the order the nodes are first reached",
            _WALK,
        ),
        Switches(walk="preorder-lifo"),
    ),
    (
        Mistake(
            "value-walk-bfs",
            "a breadth-first walk from the output",
            _WALK + " (breadth first is not enough: a "
            "node reached by a short path and a long one is visited before the long one arrives)",
        ),
        Switches(walk="bfs"),
    ),
    (
        Mistake(
            "value-walk-recursive",
            "a walk that calls a node's _backward once for every path to it (a recursion "
            "into _prev with no order, or an order built with no 'seen' set)",
            "a node used by two others is walked twice and passes its gradient on twice, once before it is "
            "complete.  Build one topological order first, each node in it once, then call each node's _backward "
            "once",
        ),
        Switches(walk="recursive"),
    ),
    (
        Mistake(
            "value-walk-not-reversed",
            "a walk that starts from the inputs",
            "the chain rule runs from the output back: call _backward in *reversed* topological order, each node "
            "after every node that uses it (a list of the nodes in the order they were first reached, reversed, "
            "is not that order)",
        ),
        Switches(walk="not-reversed"),
    ),
    (
        Mistake(
            "value-grad-overwritten",
            "the gradients assigned (=) in _backward",
            "a node used twice (a * a, or c feeding two nodes) must receive both shares: self.grad += ..., not =",
        ),
        Switches(overwrite=True),
    ),
    *[
        (
            Mistake(
                "value-grad-overwritten",
                f"the gradients assigned (=) in {op}'s _backward",
                "a node used twice (a * a, a + a, or c feeding two nodes) must receive both shares: self.grad += ..., "
                "not =",
            ),
            Switches(overwrite=op),
        )
        for op in ("add", "mul", "pow", "tanh", "exp")
    ],
    (
        Mistake(
            "value-no-seed",
            "a backward that never sets the output's grad to 1",
            "the walk starts from d out / d out = 1: set self.grad = 1.0 in backward() before the walk",
        ),
        Switches(seed=False),
    ),
    (
        Mistake(
            "value-mul-own-data",
            "self.grad += self.data * out.grad in __mul__",
            "d(a * b)/da is b: each factor's gradient is the *other* factor times out.grad",
        ),
        Switches(mul_own=True),
    ),
    (
        Mistake(
            "value-tanh-of-input",
            "(1 - self.data**2) * out.grad in tanh",
            "tanh's derivative is 1 - t**2 with t = tanh(x), the output, not the input x",
        ),
        Switches(tanh_input=True),
    ),
    (
        Mistake(
            "value-pow-no-minus-one",
            "n * self.data**n * out.grad in __pow__",
            "d(x**n)/dx = n * x**(n - 1): the exponent drops by one",
        ),
        Switches(pow_no_minus_one=True),
    ),
    (
        Mistake(
            "value-pow-no-n",
            "self.data**(n - 1) * out.grad in __pow__",
            "d(x**n)/dx = n * x**(n - 1): the factor n is missing",
        ),
        Switches(pow_no_n=True),
    ),
]
RECURSION = Mistake(
    "value-recursion",
    "a recursive walk of the graph",
    "Python stops near 1,000 nested calls; walk with an explicit stack instead",
)


class ValueSpec:
    name, cls = "value", "Value"
    mistakes = [m for m, _ in MISTAKES] + [RECURSION]

    def planned(self) -> list[str]:
        return [label for label, _, _ in EXPRESSIONS]

    def check(self, box, where: str | None) -> Report:
        """``box``: the Sandbox running the learner's Value class; each expression runs there."""
        report = Report(
            f"Checking {box.cls_name} of exercise value on {len(EXPRESSIONS)} expressions, a = {A}, b = {B}"
        )
        report.right = "every value and gradient agrees with PyTorch's autograd"
        results = {}  # label -> the learner's (out.data, a.grad, b.grad), or the LearnerFailed it raised
        for k, (label, _, _) in enumerate(EXPRESSIONS):
            try:
                got = box.request("value_run", k)
                results[label] = (
                    tuple(got)
                    if isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(v, float) for v in got)
                    else LearnerFailed("the expression's values are not numbers")
                )
            except LearnerFailed as e:
                results[label] = e
        whole = _consistent(results)
        errors: set[str] = set()
        report.plan(*self.planned())
        for label, f, look in EXPRESSIONS:
            since = len(report.log)
            report.mark(label, _one(label, f, look, results[label], whole, report, errors), report.log[since:])
        return report


def _consistent(results: dict) -> list[tuple[Mistake, dict]]:
    """The known mistakes that fit every expression the learner's engine ran: on each, the mistake gives the
    learner's numbers (right or wrong), and on one at least wrong ones.  A mistake that fits the first failing
    expression but not the next (a pre-order walk looks like ``=`` for ``+=`` on one graph, not on another) is not
    among them; nor is one that fits where a second mistake is at work.  -> each with its numbers."""
    ran = [(label, f) for label, f, _ in EXPRESSIONS if f is not deep and not isinstance(results[label], Exception)]
    out = []
    for m, switches in MISTAKES:
        theirs, ok, explains = {}, True, False
        for label, f in ran:
            try:
                theirs[label] = _run(engine(switches), f)
            except Exception:
                ok = False
                break
            if not _same(theirs[label], results[label], 1e-7):
                ok = False
                break
            explains = explains or not _same(theirs[label], _expected(f), 1e-9)
        if ok and explains:
            out.append((m, theirs))
    return out


def _expected(f):
    with torch.enable_grad():
        a, b = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (A, B))
        out = f(a, b)
        ga, gb = torch.autograd.grad(out, (a, b), allow_unused=True)
    return out.item(), (0.0 if ga is None else ga.item()), (0.0 if gb is None else gb.item())


def _close(x: float, y: float, tol: float) -> bool:
    return abs(x - y) <= tol * max(1.0, abs(x), abs(y))


def _same(x: tuple, y: tuple, tol: float) -> bool:
    return all(_close(a, b, tol) for a, b in zip(x, y, strict=True))


def _one(label, f, look, got, whole, report: Report, errors: set[str]) -> bool:
    """Report one expression; -> whether it is right."""
    if isinstance(got, LearnerFailed):
        report.fail(f"  WRONG   {label}:" + ("  the same error" if got.text in errors else ""))
        if got.text in errors:
            return False
        errors.add(got.text)
        report.fail("\n".join("    " + ln for ln in got.text.splitlines()), got.key)
        if got.key == "recursion":
            report.fail("    -> " + RECURSION.says("backward", "is"), RECURSION.key)
        return False
    want = _expected(f)
    if _same(got, want, 1e-9):
        report.say(f"  right   {label}")
        return True
    report.fail(f"  WRONG   {label}")
    for name, g, w in zip(("out.data", "a.grad", "b.grad"), got, want, strict=True):
        if not _close(g, w, 1e-9):
            report.say(f"    {name}: expected {w:.10g}, yours {g:.10g}")
    if not _close(got[0], want[0], 1e-9):
        report.say("    -> the forward value is wrong: look at the operation's data, before any gradient")
        return False
    if f is deep:
        report.say(f"    -> look at: {look}")
        return False
    for m, theirs in whole:
        if label in theirs and _same(theirs[label], got, 1e-7) and not _same(theirs[label], want, 1e-9):
            report.fail("    -> " + m.says("gradients", "match"), m.key)
            return False
    report.say(f"    -> no known mistake gives these numbers on every expression; look at: {look}")
    return False
