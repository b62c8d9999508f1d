"""Checking exercise accumulate: a batch's gradient from micro-batches, a second call that adds, zero_grad.

On each configuration (micro-batches that divide the batch, a shorter last one, one micro-batch for the whole
batch, one row each, a micro-batch larger than the batch, a seeded random draw), one object of the learner's
class, three batches:

    forward_backward(batch 1)   the loss, and .grad = batch 1's gradient (autograd's, the whole batch at once)
    forward_backward(batch 2)   .grad = batch 1's + batch 2's: a call adds, as any backward does
    zero_grad()                 every .grad None (or zeros)
    forward_backward(batch 3)   .grad = batch 3's alone

The calls run in the learner's process through the sandbox's requests (the spec's ``forward`` runs
forward_backward, or zero_grad when its inputs say so; a probe reads .grad); zero_grad is also called once on the
fresh model, before any gradient, as a training loop's first zero_grad is.  Known mistakes are replayed from the
same batches and named only when they fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import Tensor

from ..mistakes import INPUT_IN_PLACE, Mistake
from .compare import RIGHT, describe, diagnose, rel_error, same
from .configs import expand
from .guard import LearnerFailed
from .naming import matches
from .report import Report
from .spec import LayerSpec

LOSS, WHOLE = "loss: the whole batch's mean", "gradient: the whole batch's, from its micro-batches"
ADDS = "a second forward_backward adds into .grad"
CLEARS = "zero_grad clears every .grad"
AFTER = "after zero_grad: one batch's gradient alone"
UNCHANGED = "inputs left unchanged"
CONFIG = "configuration {} of {}: {}"
GRADS = ("weight.grad", "bias.grad")


def _micro(c):
    """The micro-batches of the batch in ``c``: (x rows, target rows) each."""
    m = c.micro_batch
    return [(c.x[s : s + m], c.target[s : s + m]) for s in range(0, len(c.x), m)]


def _grads_of(c, scale_of) -> dict[str, Tensor]:
    """.grad after one forward_backward in which micro-batch b's dout is 2 * diff_b * scale_of(b, rows)."""
    w, b = torch.zeros_like(c.weight), torch.zeros_like(c.bias)
    batches = _micro(c)
    for k, (xb, tb) in enumerate(batches):
        dout = 2 * (xb @ c.weight.T + c.bias - tb) * scale_of(k, len(batches), tb.numel())
        w, b = w + dout.T @ xb, b + dout.sum(0)
    return {"weight.grad": w, "bias.grad": b}


MISTAKES = [
    Mistake(
        "accum-micro-mean",
        "each micro-batch's own mean: 2 * diff / diff.numel()",
        "the loss is the mean over the whole batch's N * H elements, so each micro-batch's share is divided by "
        "N * H, not by its own count: with micro-batches of m rows yours is N / m times too large",
        lambda c: _grads_of(c, lambda k, n, count: 1 / count),
    ),
    Mistake(
        "accum-averaged-over-micro-batches",
        "the micro-batches' own means, averaged over their number",
        "that is right only when every micro-batch has the same number of rows: a shorter last one then weighs "
        "as much as a full one.  Divide each micro-batch's squared errors by N * H, the whole batch's count",
        lambda c: _grads_of(c, lambda k, n, count: 1 / (count * n)),
    ),
    Mistake(
        "accum-last-micro-batch-only",
        "the last micro-batch's share alone",
        ".grad was cleared (or assigned) for each micro-batch, so only the last one's share is left: the "
        "micro-batches' gradients must add up, += through the layer's backward, with no zero_grad between them",
        lambda c: _grads_of(c, lambda k, n, count: (k == n - 1) / c.target.numel()),
    ),
    Mistake(
        "accum-not-divided",
        "2 * diff with no division",
        "the loss is a mean over the N * H elements: each micro-batch's dout is 2 * diff / (N * H)",
        lambda c: _grads_of(c, lambda k, n, count: 1.0),
    ),
]
LOSS_MISTAKES = [
    Mistake(
        "accum-loss-mean-of-means",
        "the mean of the micro-batches' own mean losses",
        "with a shorter last micro-batch the mean of means weighs its rows more: sum every squared error and "
        "divide once by N * H",
        lambda c: {"loss": torch.stack([((xb @ c.weight.T + c.bias - tb) ** 2).mean() for xb, tb in _micro(c)]).mean()},
    ),
]
ZEROED_INSIDE = Mistake(
    "accum-zeroed-inside",
    "the second batch's gradient alone",
    "forward_backward cleared .grad before adding: a backward adds into .grad, and clearing it is zero_grad's, "
    "which the caller calls between batches (accumulating over several calls is the point)",
)
ZERO_GRAD_NOOP = Mistake(
    "accum-zero-grad-noop",
    "unchanged by zero_grad",
    "zero_grad must clear every parameter's .grad: for p in self.parameters(): p.grad = None (or zero it)",
)


def _expected(c) -> dict[str, Tensor]:
    """The loss and gradients of the whole batch at once, from torch.autograd."""
    with torch.enable_grad():
        w, b = c.weight.clone().requires_grad_(), c.bias.clone().requires_grad_()
        loss = ((c.x @ w.T + b - c.target) ** 2).mean()
        dw, db = torch.autograd.grad(loss, (w, b))
    return {"loss": loss.detach(), "weight.grad": dw, "bias.grad": db}


def _inputs(g, n=6, d=4, h=3):
    return {
        "x": torch.randn(n, d, generator=g, dtype=torch.float64),
        "target": torch.randn(n, h, generator=g, dtype=torch.float64),
    }


def _shaped(label, n, d, h, m) -> dict:
    return {
        "label": label,
        "ctor": {"in_features": d, "out_features": h, "micro_batch": m},
        "params": {
            "weight": lambda g: torch.rand(h, d, generator=g, dtype=torch.float64) * 2 - 1,
            "bias": lambda g: torch.randn(h, generator=g, dtype=torch.float64) + 0.5,
        },
        "inputs": lambda g: _inputs(g, n, d, h),
    }


def _random(g) -> dict:
    n, d, h = (int(v) for v in torch.randint(1, 8, (3,), generator=g))
    m = int(torch.randint(1, n + 2, (), generator=g))
    return _shaped(f"N = {n}, micro_batch = {m}, D = {d}, H = {h}", n, d, h, m)


def _forward(obj, t):
    """In the learner's process: zero_grad() when ``t`` is ZERO_GRAD, else forward_backward(x, target)."""
    if "zero_grad" in t:
        return obj.zero_grad()
    return obj.forward_backward(t["x"], t["target"])


ZERO_GRAD = {"zero_grad": torch.zeros(())}  # the request for zero_grad: its "inputs"


@dataclass
class AccumulateSpec(LayerSpec):
    """A LayerSpec (the sandbox builds the learner's object from it) with its own walk."""

    def planned(self) -> list[str]:
        configs = expand(self)
        return [LOSS, WHOLE, ADDS, CLEARS, AFTER, UNCHANGED] + [
            CONFIG.format(k + 1, len(configs), label) for k, (label, _) in enumerate(configs) if k
        ]

    def check(self, box, where: str | None) -> Report:
        configs = expand(self)
        report = Report(
            f"Checking {box.cls_name} of exercise accumulate on {len(configs)} configurations: three "
            f"batches, zero_grad between the second and the third"
        )
        report.right = (
            f"the loss and every .grad agree with PyTorch's autograd on the whole batch at once, on all "
            f"{len(configs)} configurations"
        )
        report.plan(*self.planned())
        failing = None
        for number, (label, cfg) in enumerate(configs):
            sub = Report("") if failing is not None else report
            mark = report.mark if number == 0 else (lambda *a, **k: None)
            since = len(report.log)
            try:
                ok = _walk(cfg, box, number, len(configs), sub, mark)
            except LearnerFailed as e:
                sub.fail(e.text, e.key)
                ok = False
            if number:
                report.mark(CONFIG.format(number + 1, len(configs), label), ok)
            if not ok and failing is None:
                failing = number
                report.settle(since)
                report.say(f"  (configuration {number + 1}, {label}, is the one that failed)")
        if failing is not None:
            report.passed = False
            if failing == 0:
                decided = [
                    i for i in report.items.values() if i.passed is not None and not i.name.startswith("configuration")
                ]
                report.say(
                    "  each item on its own, on the default configuration: "
                    + "; ".join(f"{i.name}: {'right' if i.passed else 'wrong'}" for i in decided)
                )
            others = [str(k + 1) for k in range(1, len(configs)) if k != failing]
            right = [
                k for k in others if report.items[CONFIG.format(int(k), len(configs), configs[int(k) - 1][0])].passed
            ]
            if others:
                report.say(f"  the other configurations: {', '.join(right) or 'none'} right")
        report.settle()
        return report


def _walk(cfg, box, number: int, total: int, report: Report, mark) -> bool:
    g = torch.Generator().manual_seed(cfg.seed)
    params = {n: make(g) for n, make in cfg.params.items()}
    batches = [cfg.inputs(g) for _ in range(3)]
    ctxs = [SimpleNamespace(**b, **params, **cfg.ctor) for b in batches]
    want = [_expected(c) for c in ctxs]
    n, d = batches[0]["x"].shape
    report.say(
        f"  configuration {number + 1} of {total}, {cfg.label}: {box.cls_name}({d}, "
        f"{cfg.ctor['out_features']}, micro_batch={cfg.ctor['micro_batch']}) on batches x ({n}, {d})"
    )
    why = box.request("construct", number, params)
    if why is not None:
        report.fail("  " + why)
        return False
    try:  # zero_grad on a model that has no gradient yet, as a training loop's first zero_grad is
        box.request("forward", ZERO_GRAD)
    except LearnerFailed as e:
        mark(CLEARS, False)
        report.fail("  zero_grad on a fresh model, before any gradient (every .grad None), raised:")
        report.fail(e.text, e.key)
        return False
    ok = True

    def call(k) -> dict | None:
        nonlocal ok
        loss, given = box.request("forward", batches[k])
        for name, t in batches[k].items():
            if not (isinstance(given.get(name), Tensor) and torch.equal(given[name], t)):
                report.fail("  " + INPUT_IN_PLACE.says(name, "was"), INPUT_IN_PLACE.key)
                mark(UNCHANGED, False, [INPUT_IN_PLACE.key])
                ok = False
                return None
        if k == 0:
            mark(UNCHANGED, True)
            right = isinstance(loss, Tensor) and same(loss, want[0]["loss"], RIGHT)
            mark(LOSS, right)
            if not right:
                ok = False
                report.fail("  the loss is wrong.  " + describe("loss", loss, want[0]["loss"]))
                for m in LOSS_MISTAKES:
                    if matches(loss, m.value(ctxs[0])["loss"], want[0]["loss"]):
                        report.fail("  -> " + m.says("loss"), m.key)
                        break
        return box.request("probe", GRADS)

    sink = Report("")

    def out() -> Report:  # the first failure is told in full; the items after it are judged, not told
        return report if report.passed else sink

    got1 = call(0)
    if got1 is None:
        return False
    whole = _grads_right(got1, want[0], out(), mark, WHOLE, "after one forward_backward", ctxs[0])
    got2 = call(1)
    if got2 is None:
        return False
    both = {n: want[0][n] + want[1][n] for n in GRADS}
    if whole:
        adds = _grads_right(
            got2,
            both,
            out(),
            mark,
            ADDS,
            "after a second forward_backward, with no zero_grad between (.grad must hold both batches' gradients)",
            None,
            alone=want[1],
        )
    box.request("forward", ZERO_GRAD)
    cleared = box.request("probe", GRADS)
    clears = True
    for name in GRADS:
        value = cleared.get(name)
        if value is not None and not (isinstance(value, Tensor) and not value.any()):
            clears, told = False, out()
            told.fail(
                f"  after zero_grad, {name} still holds "
                + (f"a {type(value).__name__}" if not isinstance(value, Tensor) else "gradients")
            )
            if isinstance(value, Tensor) and same(value, got2[name], RIGHT):
                told.fail("  -> " + ZERO_GRAD_NOOP.says(name, "was"), ZERO_GRAD_NOOP.key)
            break
    mark(CLEARS, clears, [] if clears else [ZERO_GRAD_NOOP.key])
    got3 = call(2)
    if got3 is None:
        return False
    if whole:
        after = clears and _grads_right(
            got3, want[2], out(), mark, AFTER, "after zero_grad and a third forward_backward", None
        )
    else:  # the formula is wrong: the learner's own gradients of batches 2 and 3 (fresh models) stand for the right
        theirs = [_fresh(box, number, params, batches[k]) for k in (1, 2)]
        adds = theirs[0] is not None and all(_close(got2[n], got1[n] + theirs[0][n]) for n in GRADS)
        after = clears and theirs[1] is not None and all(_close(got3[n], theirs[1][n]) for n in GRADS)
        mark(ADDS, adds)
        mark(AFTER, after)
    if whole and adds and clears and after and ok:
        report.say(
            "    right: the loss, the whole batch's gradient from its micro-batches, a second call adding, "
            "zero_grad clearing"
        )
    return whole and adds and clears and after and ok


def _close(a, b) -> bool:
    return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and same(a, b, RIGHT)


def _fresh(box, number: int, params: dict, batch: dict) -> dict | None:
    """.grad after one forward_backward of ``batch`` on a fresh model of the learner's class (None: it raised)."""
    try:
        if box.request("construct", number, params) is not None:
            return None
        box.request("forward", batch)
        return box.request("probe", GRADS)
    except LearnerFailed:
        return None


def _grads_right(got: dict, want: dict, report: Report, mark, item: str, when: str, ctx, alone=None) -> bool:
    """Each .grad as ``want``; else said (the mistake named when one fits), ``item`` failed."""
    wrong = [n for n in GRADS if not (isinstance(got.get(n), Tensor) and same(got[n], want[n], RIGHT))]
    mark(item, not wrong)
    if not wrong:
        return True
    report.fail(f"  .grad is wrong {when}:")
    for n in GRADS:
        mine = got.get(n)
        if n in wrong:
            report.say(f"    WRONG  {n} is None" if mine is None else f"    WRONG  {describe(n, mine, want[n])}")
        else:
            report.say(f"    right  {n} (relative error {rel_error(mine, want[n]):.1e})")
    mine = got.get(wrong[0])
    if alone is not None and all(isinstance(got.get(n), Tensor) and same(got[n], alone[n], RIGHT) for n in GRADS):
        report.fail("  -> " + ZEROED_INSIDE.says(".grad", "holds"), ZEROED_INSIDE.key)
        return False
    if ctx is not None:
        for m in MISTAKES:
            replay = m.value(ctx)
            if all(
                isinstance(got.get(n), Tensor)
                and (
                    matches(got[n], replay[n], want[n])
                    or same(replay[n], want[n], RIGHT)
                    and same(got[n], want[n], RIGHT)
                )
                for n in GRADS
            ) and any(matches(got[n], replay[n], want[n]) for n in GRADS):
                report.fail("  -> " + m.says(".grad", "holds"), m.key)
                return False
    if isinstance(mine, Tensor):
        for line in diagnose(wrong[0], mine, want[wrong[0]], {}):
            report.say("  -> " + line)
    report.say(
        "  look at: each micro-batch's dout, 2 * diff / (N * H), through the layer's backward (+=), and "
        "nothing that clears .grad inside forward_backward"
    )
    return False


SPEC = AccumulateSpec(
    name="accumulate",
    cls="Accumulate",
    ctor={"in_features": 4, "out_features": 3, "micro_batch": 2},
    params={
        "weight": lambda g: torch.rand(3, 4, generator=g, dtype=torch.float64) * 2 - 1,
        "bias": lambda g: torch.randn(3, generator=g, dtype=torch.float64) + 0.5,
    },
    inputs=_inputs,
    reference=lambda t: {"loss": ((t.x @ t.weight.T + t.bias - t.target) ** 2).mean()},
    loss=True,
    constants=("target",),
    forward=_forward,
    mistakes=MISTAKES + LOSS_MISTAKES + [ZEROED_INSIDE, ZERO_GRAD_NOOP],
    configs=[
        _shaped("a shorter last micro-batch: N = 7, micro_batch = 3", 7, 4, 3, 3),
        _shaped("one micro-batch for the whole batch: N = 5, micro_batch = 5", 5, 4, 3, 5),
        _shaped("one row at a time: N = 4, micro_batch = 1", 4, 2, 5, 1),
        _shaped("a micro-batch larger than the batch: N = 3, micro_batch = 8", 3, 4, 3, 8),
    ],
    random=_random,
)
