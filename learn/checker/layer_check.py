"""Checking a learner's layer: on every configuration, forward and backward twice and a second backward after the
same forward, every tensor against autograd, each item decided on its own.

The walk, per configuration (configs.py): build the layer in the learner's process (sandbox.py), set its
parameters, then twice: forward (the output compared, the inputs must be left as they were), backward with a
random dout (each returned gradient and each ``.grad`` compared; the second call's ``.grad`` must hold both
calls' gradients; dout must be left as it was); then one more backward, with a new dout, after the same forward: a
layer must give that dout's gradients (a backward that changed what its forward kept gives others) or refuse.
Expected values are computed here, from torch.autograd, and never leave this process.

Every configuration is run, and every item of the default one is decided on its own (a wrong bias gradient
does not make accumulation "not checked"; accumulation and the second backward are judged against the
learner's own gradients where those are wrong), so a grader's score says how much is right.  The report shows
the configurations up to the first that fails, that one in full: a table of every tensor, where the pattern
points, and the mistake, named only when one known mistake fits the evidence of every configuration
(naming.py), and central differences of the learner's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from torch import Tensor

from ..mistakes import CACHE_CHANGED, DOUT_IN_PLACE, INPUT_IN_PLACE, OVERFLOW
from .compare import RIGHT, SAME, describe, rel_error, same, shape_of, unravel, vjp, worst
from .configs import expand
from .guard import LearnerFailed
from .intermediates import TRACES, compare, expected
from .naming import Evidence, name_it, param_candidates
from .report import Report
from .sandbox import NotPlain
from .spec import F64, LayerSpec

CALLS = 2  # forward + backward twice: the second backward must add to the first's .grad
# the items of a report (Report.items), each a test of its own for a grader: on the default configuration
FORWARD, GRADIENT = "forward: {}", "gradient: {}"
ACCUMULATE = "accumulation: a second backward adds into each .grad"
AGAIN = "a second backward after the same forward: the same gradients again, or a refusal"
UNCHANGED = "inputs and dout left unchanged"
NUMERIC = "central differences of your forward agree with the gradients"
CONFIG = "configuration {} of {}: {}"
LAYOUT = "layout: each rank's shards"
REPLICAS = "every rank holds the same result"
NUMERIC_OK = 1e-5  # central differences (h = 1e-6) of a right forward agree with autograd far closer than this


@dataclass
class Call:
    inputs: dict[str, Tensor]
    douts: dict[str, Tensor]
    outputs: dict[str, Tensor]
    grads: dict[str, Tensor]  # expected: "dx" for an input x, "weight.grad" for a parameter
    ctx: SimpleNamespace  # everything, by name, for the mistakes' formulas


def reference_call(
    spec: LayerSpec,
    params: dict[str, Tensor],
    inputs: dict[str, Tensor],
    g,
    call: int = 0,
    douts: dict[str, Tensor] | None = None,
) -> Call:
    """The expected outputs and gradients of one forward/backward, from torch.autograd (its own leaves: nothing
    here depends on how a layer's tensors were made).  ``call``: which forward of one object this is (a layer
    that draws, dropout, draws anew at each); ``douts``: given, else drawn from ``g``."""
    with torch.enable_grad():
        leaves = {
            n: t.detach().clone().requires_grad_(t.is_floating_point() and n not in spec.constants)
            for n, t in {**inputs, **params}.items()
        }
        outputs = spec.reference(SimpleNamespace(**leaves, **spec.ctor, call=call))
        if spec.loss:
            douts, grad_outputs = {}, [torch.ones((), dtype=F64)]
        else:  # random, never ones: the gradient of sum(out) through a normalisation is zero and passes anything
            if douts is None:
                douts = {f"d{o}": torch.randn(t.shape, generator=g, dtype=F64) for o, t in outputs.items()}
            grad_outputs = list(douts.values())
        wrt = [n for n, t in leaves.items() if t.requires_grad]
        found = vjp(list(outputs.values()), [leaves[n] for n in wrt], grad_outputs) if wrt else ()
    grads = {}
    for n, d in zip(wrt, found, strict=True):
        d = torch.zeros_like(leaves[n]) if d is None else d
        grads[f"{n}.grad" if n in params else f"d{n}"] = d.detach()
    ctx = SimpleNamespace(
        **{n: t.detach() for n, t in leaves.items()},
        **douts,
        **spec.ctor,
        call=call,
        **{o: t.detach() for o, t in outputs.items()},
        expected=grads,
    )
    if spec.context is not None:
        vars(ctx).update(spec.context(ctx))
    return Call(inputs, douts, {o: t.detach() for o, t in outputs.items()}, grads, ctx)


def items(spec: LayerSpec, outputs, grads, params) -> list[str]:
    """The items checked on the default configuration, then one per further configuration."""
    configs = expand(spec)
    names = ([LAYOUT] if spec.layout else []) + [FORWARD.format(o) for o in outputs]
    names += [GRADIENT.format(g) for g in grads]
    names += [ACCUMULATE] if params else []
    names += [AGAIN, UNCHANGED] + ([REPLICAS] if spec.replicas else []) + ([NUMERIC] if spec.numeric else [])
    return names + [CONFIG.format(n + 1, len(configs), label) for n, (label, _) in enumerate(configs) if n]


def planned(spec: LayerSpec) -> list[str]:
    """``items`` without a learner: from the reference on the default configuration."""
    g = torch.Generator().manual_seed(spec.seed)
    params = {n: make(g) for n, make in spec.params.items()}
    c = reference_call(spec, params, spec.inputs(g), g)
    return items(spec, c.outputs, _returns(spec, c) + tuple(f"{p}.grad" for p in params), params)


def _returns(spec: LayerSpec, c: Call) -> tuple[str, ...]:
    return spec.returns if spec.returns is not None else tuple(n for n in c.grads if not n.endswith(".grad"))


def check_layer(spec: LayerSpec, box, where: str | None) -> Report:
    """Check the layer in ``box`` (a Sandbox holding the learner's class) on every configuration of ``spec``."""
    configs = expand(spec)
    report = Report(f"Checking {box.cls_name} of exercise {spec.name} on {len(configs)} configurations")
    report.right = (
        f"every tensor agrees with {spec.versus} on all {len(configs)} configurations, and with "
        f"central differences of your forward"
    )
    runs: list[_Run] = []
    for number, (_label, cfg) in enumerate(configs):
        run = _Run(cfg, box, number, len(configs), report if number == 0 else None)
        run.go()
        runs.append(run)
    evidence = [r.evidence for r in runs if r.evidence is not None]
    failing = next((r for r in runs if not r.ok), None)
    for r in runs:
        r.resolve(evidence if r is failing else None)
        report.lines += r.scratch.lines
        if r is failing:
            for key in r.scratch.log:
                report.log.append(key)
                if key not in report.named:
                    report.named.append(key)
            report.passed = False
            report.say(f"  (configuration {r.number + 1}, {r.label}, is the one that failed)")
            break
    for r in runs[1:]:
        report.mark(CONFIG.format(r.number + 1, len(configs), r.label), r.ok)
    if failing is not None:
        report.passed = False
        _also(report, runs, failing)
        report.settle()
    return report


def _also(report: Report, runs: list, failing) -> None:
    """After the failure shown: what else was decided on its own (the score counts it), in one or two lines."""
    decided = [i for i in report.items.values() if i.passed is not None and not i.name.startswith("configuration")]
    wrong = [i.name for i in decided if i.passed is False]
    if runs[0] is failing and decided:
        right = [i.name for i in decided if i.passed]
        report.say(
            "  each item on its own, on the default configuration: "
            + (f"right: {'; '.join(right)}" if right else "none right")
            + (f".  Wrong: {'; '.join(wrong)}" if wrong else "")
        )
    others = [r for r in runs if r.number and r is not failing]
    if others:
        good = [str(r.number + 1) for r in others if r.ok]
        bad = [str(r.number + 1) for r in others if not r.ok]
        report.say(
            "  the other configurations: "
            + ", ".join(
                part
                for part in ((f"{', '.join(good)} right" if good else ""), (f"{', '.join(bad)} wrong" if bad else ""))
                if part
            )
        )


def _unmarked(*args, **kwargs) -> None:
    """``mark`` after the default configuration: the items are that configuration's."""


@dataclass
class _Site:
    """A naming left for later, when every configuration's evidence is in: ``args`` of name_it, its place."""

    at: int
    name: str
    args: dict = field(default_factory=dict)


class _Run:
    """One configuration's walk: its requests, each item's verdict, its lines (``scratch``), its evidence."""

    def __init__(self, spec: LayerSpec, box, number: int, total: int, main: Report | None):
        self.spec, self.box, self.number, self.label = spec, box, number, spec.label
        self.scratch = Report("")  # this configuration's lines, and the keys named in them
        self.main = main  # the report whose items this configuration decides (the default one's), or None
        self.mark = main.mark if main is not None else _unmarked
        self.ok = True
        self.told = False  # the first failure is told in full; later ones (judged all the same) are not
        self.sites: list[_Site] = []
        self.evidence: Evidence | None = None
        self.errors: dict[str, float] = {}
        self.unchanged = True
        self.total = total

    # -- reporting --------------------------------------------------------------------------------------------
    def fail(self, line: str, key: str | None = None) -> None:
        """A failure: said when it is the first of this configuration, else only counted."""
        self.ok = False
        if not self.told:
            self.scratch.fail(line, key)

    def say(self, line: str) -> None:
        if not self.told:
            self.scratch.say(line)

    def settle_told(self) -> None:
        """The first failure has been told: what follows is judged, not said."""
        self.told = True

    def name(self, name: str, **args) -> None:
        """Name the mistake in ``name`` later (``resolve``), from every configuration's evidence."""
        if not self.told:
            self.sites.append(_Site(len(self.scratch.lines), name, args))

    def resolve(self, evidence: list | None) -> None:
        """Fill in the namings, last first (each goes in at its place), with the evidence of every configuration
        (None: this configuration's text is not shown, nothing to name)."""
        if evidence is None:
            return
        said, keys = {}, []  # a naming already given (the tensor's name taken out) -> the lines that gave it
        subs = []
        for site in self.sites:
            sub = Report("")
            name_it(self.spec, site.name, report=sub, evidence=evidence, **site.args)
            same_as = said.get(tuple(ln.replace(f"your {site.name} ", "your _ ") for ln in sub.lines))
            if sub.log and same_as is not None:  # the same mistake in another tensor: one line says both
                same_as[0] = (
                    same_as[0].replace(" equals ", f" (and your {site.name}) equals ", 1)
                    if "(and your" not in same_as[0]
                    else same_as[0].replace(") equals ", f", {site.name}) equals ", 1)
                )
                sub.lines = []
            elif sub.log:
                said[tuple(ln.replace(f"your {site.name} ", "your _ ") for ln in sub.lines)] = sub.lines
            subs.append(sub)
            keys += sub.log
        for site, sub in reversed(list(zip(self.sites, subs, strict=True))):
            self.scratch.lines[site.at : site.at] = sub.lines
        self.scratch.log[:0] = keys
        self.scratch.named = list(dict.fromkeys(self.scratch.log))

    # -- the walk ---------------------------------------------------------------------------------------------
    def go(self) -> None:
        spec, box = self.spec, self.box
        g = torch.Generator().manual_seed(spec.seed)
        self.params = {n: make(g) for n, make in spec.params.items()}
        inputs = [spec.inputs(g) for _ in range(CALLS)]
        self.calls = [reference_call(spec, self.params, inputs[k], g, call=k) for k in range(CALLS)]
        # the second backward after the last forward: a new dout (a loss has none: the same call again)
        self.calls.append(
            self.calls[-1] if spec.loss else reference_call(spec, self.params, inputs[-1], g, call=CALLS - 1)
        )
        args = ", ".join(f"{k}={v!r}" for k, v in spec.ctor.items())
        shapes = "; ".join(f"{n} {tuple(t.shape)}" for n, t in self.calls[0].inputs.items())
        self.scratch.say(
            f"  configuration {self.number + 1} of {self.total}, {self.label}: {box.cls_name}({args}) on {shapes}"
        )
        if self.main is not None:
            c = self.calls[0]
            self.main.plan(
                *items(spec, c.outputs, _returns(spec, c) + tuple(f"{p}.grad" for p in self.params), self.params)
            )
        try:
            self._walk()
        except LearnerFailed as e:
            self.fail(e.text, e.key)
            self.settle_told()

    def _walk(self) -> None:
        spec, box = self.spec, self.box
        why = box.request("construct", self.number, self.params)
        if why is not None:
            self.fail("  " + why)
            return
        if spec.layout is not None and not self._layout():
            return
        self.got = []  # per call: {tensor: the learner's} (outputs, returned gradients, each .grad after it)
        for k in range(CALLS):
            outs = self._forward(k)
            if outs is None:
                return
            grads = self._backward(k)
            if grads is None:
                return
            self.got.append({**outs, **grads})
            if k == 0:
                c = self.calls[0]
                self.evidence = Evidence(c.ctx, dict(self.got[0]), {**c.outputs, **c.grads}, self.label)
            if spec.replicas and not self._replicas():
                return
        self._again()
        if getattr(self, "accumulated", None) is not None:
            self._accumulation(*self.accumulated)
        self.mark(UNCHANGED, self.unchanged, [INPUT_IN_PLACE.key] if not self.unchanged else [])
        if spec.numeric:
            self._numeric()
        if self.ok:
            self.say(
                "    right; the largest relative errors over two calls: "
                + ", ".join(f"{n} {e:.1e}" for n, e in self.errors.items())
            )

    def _layout(self) -> bool:
        """The learner's shards, one per rank, right after construction: each the expected block of its
        parameter."""
        want = self.spec.layout(self.calls[0].ctx)
        got = self.box.request("probe", tuple(want))
        for path, parts in want.items():
            mine = got.get(path)
            if _parts_equal(mine, parts, RIGHT):
                continue
            self.fail(
                f"  layout is wrong: self.{path} should hold {len(parts)} shards, one per rank, of shapes "
                f"{_shapes(parts)}, each the block of the parameter that rank holds; yours: {_shapes(mine)}"
            )
            for m, alt in self.spec.layout_mistakes:
                if _parts_equal(mine, alt(self.calls[0].ctx).get(path), SAME):
                    self.fail("  -> " + m.says(f"self.{path}", "is"), m.key)
                    self.mark(LAYOUT, False, [m.key])
                    return False
            if isinstance(mine, list) and [shape_of(t) for t in mine] == [shape_of(t) for t in parts]:
                self.say(
                    "  -> the shapes are right, the values are not: is each shard a view of the parameter "
                    "(shard() gives views)?  The checker sets the parameters after the constructor, and a "
                    "copy never sees them"
                )
            self.mark(LAYOUT, False)
            return False
        self.mark(LAYOUT, True)
        return True

    def _replicas(self) -> bool:
        """After a forward and backward: each list of per-rank results holds one value on every rank."""
        for path, parts in self.box.request("probe", self.spec.replicas).items():
            if not isinstance(parts, list) or not parts:
                self.fail(f"  self.{path} is {shape_of(parts)}: it should be a list with one tensor per rank")
                self.mark(REPLICAS, False)
                return False
            for r, t in enumerate(parts[1:], 1):
                if not same(t, parts[0], RIGHT):
                    self.fail(
                        f"  rank {r}'s {path} differs from rank 0's: after an all-reduce every rank holds "
                        f"the same sum.  " + describe(f"{path}[{r}]", t, parts[0])
                    )
                    self.mark(REPLICAS, False)
                    return False
        self.mark(REPLICAS, True)
        return True

    def _unchanged(self, given: dict, originals: dict[str, Tensor], what=INPUT_IN_PLACE) -> None:
        """Each of ``originals`` as ``given`` back after a call (bit for bit); else ``what`` named."""
        for n, t in originals.items():
            if not (isinstance(given.get(n), Tensor) and torch.equal(given[n], t)):
                if self.unchanged:
                    self.fail("  " + what.says(n, "was"), what.key)
                    self.settle_told()
                    if self.main is not None:
                        self.main.mark(UNCHANGED, False, [what.key])
                self.unchanged = False
                return

    def _forward(self, k: int) -> dict | None:
        """Call k's forward: -> the learner's outputs by name (None: unusable, the walk ends)."""
        c = self.calls[k]
        result, given = self.box.request("forward", c.inputs)
        outs = _as_dict(result, tuple(c.outputs), f"{self.box.cls_name}.forward")
        self._unchanged(given, c.inputs)
        for name, want in c.outputs.items():
            actual = outs[name]
            _plain(name, actual)
            if same(actual, want, RIGHT):
                self.errors[name] = max(self.errors.get(name, 0.0), rel_error(actual, want))
                self.mark(FORWARD.format(name), True)
                continue
            self.mark(FORWARD.format(name), False)
            self.fail(f"  forward is wrong.  {describe(name, actual, want)}")
            self._overflow(name, actual, want, c)
            self.name(name, actual=actual, candidates=_candidates(self.spec, c, name), c=c, expected=want)
            self.settle_told()
        return outs

    def _overflow(self, name: str, actual, want: Tensor, c: Call) -> None:
        """nan or inf where autograd's value is finite, in a configuration of large inputs: an exp overflowed."""
        if _overflowed(actual, want, self.label):
            self._say_overflow(name)
            self.settle_told()

    def _say_overflow(self, name: str) -> None:
        self.fail("  -> " + OVERFLOW.says(name, "has"), OVERFLOW.key)
        if self.spec.nan_hint:
            self.say(f"  here: {self.spec.nan_hint}")

    def _backward(self, k: int) -> dict | None:
        """Call k's backward: -> {tensor: the learner's} (each returned gradient, each .grad after it), or None
        when it raised (the walk ends)."""
        spec, c = self.spec, self.calls[k]
        returns = _returns(spec, c)
        try:
            result, given, pgrads, inputs_after = self.box.request("backward", c.douts)
        except LearnerFailed as e:
            self.fail(e.text, e.key)
            for pname, value in e.attempted.items():  # what the failing line tried to add into .grad
                name = f"{pname}.grad"
                if value.shape != c.grads[name].shape:
                    self.say(
                        f"  that line tried to put a tensor of shape {tuple(value.shape)} into {name} "
                        f"{tuple(c.grads[name].shape)}"
                    )
                self.name(
                    name, actual=value, candidates=_candidates(spec, c, name), c=c, expected=c.grads[name], quiet=True
                )
            self.settle_told()
            return None
        got = _as_dict(result, returns, f"{self.box.cls_name}.backward") if returns else {}
        saved = self._intermediates(c) if k == 0 else []
        self._unchanged(given, c.douts, DOUT_IN_PLACE)
        self._unchanged(inputs_after, c.inputs)
        rows = []  # (name, actual, want, candidates()): want is autograd's; the replays made only when wrong
        for name in returns:
            rows.append((name, got[name], c.grads[name], lambda name=name: _candidates(spec, c, name)))
        for p in self.params:
            name = f"{p}.grad"
            rows.append(
                (
                    name,
                    pgrads[p],
                    sum(self.calls[j].grads[name] for j in range(k + 1)),
                    lambda name=name: param_candidates(spec, self.calls, k, name, _formulas(spec)),
                )
            )
        wrong = []
        for name, actual, want, _ in rows:
            _plain(name, actual)
            right = same(actual, want, RIGHT)
            if not (k and name.endswith(".grad")):
                self.mark(GRADIENT.format(name), right)
            if right:
                self.errors[name] = max(self.errors.get(name, 0.0), rel_error(actual, want))
            else:
                wrong.append(name)
        if k and any(n.endswith(".grad") for n, *_ in rows):
            self.accumulated = (rows, wrong)  # judged after the second backward (it may need a fresh object)
        if saved and (spec.label == "the default" or wrong):
            self.say("    your self.saved, beside autograd's on the same forward (call 1):")
            for line in saved:
                self.say(line)
        if wrong:
            self._tell_backward(k, rows, wrong)
        return {n: a for n, a, *_ in rows}

    def _tell_backward(self, k: int, rows: list, wrong: list[str]) -> None:
        if self.told:  # a failure was told already: this one is judged (its items), not told
            self.ok = False
            return
        c = self.calls[k]
        when = "" if k == 0 else " after the second forward/backward (a .grad must hold the sum of both calls')"
        self.fail(
            f"  backward is wrong{when}.  Each tensor (the relative error is the tensor's: its largest "
            f"difference over its largest entry):"
        )
        for name, actual, want, _ in rows:
            if name in wrong:
                if actual is None and name.endswith(".grad"):
                    self.say(
                        f"    WRONG  {name} is None: your backward must add the gradient into self.{name} "
                        f"(creating it when it is None)" + (_stray(self.box, want) if not self.told else "")
                    )
                else:
                    self.say(f"    WRONG  {describe(name, actual, want)}")
            else:
                self.say(f"    right  {name} (relative error {rel_error(actual, want):.1e})")
        line = _localise(self.spec, [r[0] for r in rows], wrong, k, self.got, self.calls)
        if line:
            self.say("  " + line)
        first = True
        ruled_out = _ruled_out(self.spec, c, [r[0] for r in rows], wrong)
        for name, actual, want, candidates in rows:
            if name in wrong and actual is not None:
                candidates = [None if i in ruled_out else cand for i, cand in enumerate(candidates())]
                if not self.told:
                    if _overflowed(actual, want, self.label):
                        self._say_overflow(name)
                        first = False
                        continue
                    num = None  # central differences at the worst entry, now: the object is this configuration's
                    if first and isinstance(actual, Tensor) and actual.shape == want.shape:
                        num = _central(self.box, c, name, worst(actual, want)[0])
                    self.name(
                        name,
                        actual=actual,
                        candidates=candidates,
                        c=c,
                        expected=want,
                        quiet=not first,
                        k=k,
                        numeric=(lambda index, num=num: num) if first else None,
                    )
                first = False
        self.settle_told()

    def _accumulation(self, rows: list, wrong: list[str]) -> None:
        """ACCUMULATE, on its own: each .grad after the second call is the first call's plus the second's; where
        the learner's gradient is wrong, their own second gradient (from a fresh object) stands for the right."""
        grad_rows = [(n, a, w) for n, a, w, _ in rows if n.endswith(".grad")]
        if all(n not in wrong for n, _, _ in grad_rows):
            self.mark(ACCUMULATE, True)
            return
        first = self.got[0]
        if all(same(first.get(n), self.calls[0].grads[n], RIGHT) for n, _, _ in grad_rows):
            self.mark(ACCUMULATE, False)  # the first call's gradients right, their sum not: the accumulation
            return
        theirs = self._fresh(self.calls[1])  # the learner's own gradients of the second call alone
        ok = theirs is not None and all(
            isinstance(a, Tensor)
            and isinstance(first.get(n), Tensor)
            and isinstance(theirs.get(n), Tensor)
            and first[n].shape == theirs[n].shape == a.shape
            and same(a, first[n] + theirs[n], RIGHT)
            for n, a, _ in grad_rows
        )
        self.mark(ACCUMULATE, ok)

    def _fresh(self, c: Call, douts: dict | None = None) -> dict | None:
        """The learner's gradients of call ``c`` (its forward, then ``douts`` or its own) on a fresh object whose
        forwards before it were the ones the walk made (a layer that draws, dropout, draws the same): {tensor:
        value}, or None when it raised."""
        try:
            if self.box.request("construct", self.number, self.params) is not None:
                return None
            for j in range(CALLS):
                self.box.request("forward", self.calls[j].inputs)
                if self.calls[j] is c:
                    break
            result, _, pgrads, _ = self.box.request("backward", c.douts if douts is None else douts)
        except LearnerFailed:
            return None
        returns = _returns(self.spec, c)
        try:
            got = _as_dict(result, returns, "") if returns else {}
        except LearnerFailed:
            return None
        return {**got, **{f"{p}.grad": v for p, v in pgrads.items()}}

    def _again(self) -> None:
        """AGAIN: one more backward, with a new dout, after the last forward: the gradients of that dout, each
        .grad adding them; or a refusal (an exception), as torch refuses a second backward through a graph."""
        c, last = self.calls[-1], self.calls[CALLS - 1]
        returns = _returns(self.spec, c)
        before = self.got[-1]
        try:
            result, given, pgrads, inputs_after = self.box.request("backward", c.douts)
        except LearnerFailed as e:
            said = [ln.strip() for ln in e.text.strip().splitlines() if ln.strip()] or ["an exception"]
            self.say(
                f"    a second backward after one forward is refused ({said[2] if len(said) > 2 else said[0]}): "
                f"fine, torch refuses it too"
            )
            self.mark(AGAIN, True)
            return
        self._unchanged(given, c.douts, DOUT_IN_PLACE)
        self._unchanged(inputs_after, c.inputs)
        try:
            got = _as_dict(result, returns, f"{self.box.cls_name}.backward") if returns else {}
        except LearnerFailed as e:
            self.fail(e.text, e.key)
            self.settle_told()
            self.mark(AGAIN, False)
            return
        mine = {**got, **{f"{p}.grad": v for p, v in pgrads.items()}}
        want = {n: c.grads[n] for n in returns}
        for p in self.params:  # the .grad before it, plus this dout's; where the learner's backward assigns .grad
            n = f"{p}.grad"  # (ACCUMULATE failed on that), this dout's alone: one mistake, one item
            base = before.get(n) if isinstance(before.get(n), Tensor) else 0
            if (
                isinstance(before.get(n), Tensor)
                and same(before[n], last.grads[n], RIGHT)
                and not same(before[n], sum(self.calls[j].grads[n] for j in range(CALLS)), RIGHT)
            ):
                base = 0
            want[n] = base + c.grads[n]
        bad = [n for n in want if not (isinstance(mine.get(n), Tensor) and same(mine[n], want[n], RIGHT))]
        if not bad:
            self.mark(AGAIN, True)
            return
        right_before = all(
            same(
                before.get(n),
                (last.grads[n] if not n.endswith(".grad") else sum(self.calls[j].grads[n] for j in range(CALLS))),
                RIGHT,
            )
            for n in want
        )
        if right_before:  # the first backward after this forward was right, the second is not: the cache
            n = bad[0]
            self.fail(
                "  a second backward after the same forward is wrong (the first was right).  "
                + describe(n, mine.get(n), want[n])
            )
            self.fail("  -> " + CACHE_CHANGED.says("backward", "gives"), CACHE_CHANGED.key)
            self.mark(AGAIN, False, [CACHE_CHANGED.key])
            self.settle_told()
            return
        # the gradients were wrong already: judge the second backward against the learner's own gradients of
        # that dout, from a fresh object
        theirs = self._fresh(last, c.douts)
        if theirs is None:
            self.fail(
                "  a second backward after the same forward is wrong, and your layer raised when its gradients "
                "for that dout were taken from a fresh forward"
            )
            self.mark(AGAIN, False)
            return
        ok = True
        for n in want:
            mine_n, theirs_n = mine.get(n), (theirs or {}).get(n)
            if n.endswith(".grad"):
                base = before.get(n)
                ok = (
                    ok
                    and all(isinstance(t, Tensor) for t in (mine_n, theirs_n, base))
                    and mine_n.shape == base.shape == theirs_n.shape
                    and same(mine_n, base + theirs_n, RIGHT)
                )
            else:
                ok = (
                    ok
                    and isinstance(mine_n, Tensor)
                    and isinstance(theirs_n, Tensor)
                    and mine_n.shape == theirs_n.shape
                    and same(mine_n, theirs_n, RIGHT)
                )
        self.mark(AGAIN, ok, [] if ok else [CACHE_CHANGED.key])
        if not ok:
            self.fail(
                "  a second backward after the same forward gives other gradients than your own backward "
                "gives that dout after a fresh forward: " + CACHE_CHANGED.why,
                CACHE_CHANGED.key,
            )

    def _numeric(self) -> None:
        gap = _numeric_summary(self.box, self.calls[CALLS - 1])
        self.mark(NUMERIC, gap is None or gap <= NUMERIC_OK)
        if gap is not None and gap > NUMERIC_OK:
            self.fail(
                f"  central differences of your forward (h = 1e-6) disagree with the gradients by {gap:.0e} "
                f"(a right layer agrees to about 1e-8): your forward does not compute the function whose "
                f"gradient your backward returns (does it depend on how often it is called, or keep a "
                f"result?)"
            )
        elif gap is not None and self.ok:
            self.say(f"    central differences of your forward (h = 1e-6) agree with them to {gap:.0e}")

    def _intermediates(self, c: Call) -> list[str]:
        """What the learner recorded in self.saved (opt-in), each beside autograd's intermediate: the lines."""
        trace = TRACES.get(self.spec.name)
        saved = self.box.request("saved") if trace is not None else {}
        if not saved:
            return []
        return compare(saved, expected(trace, {**c.inputs, **self.params}, self.spec.ctor, c.douts, self.spec.loss))


def _overflowed(actual, want: Tensor, label: str) -> bool:
    """nan or inf where autograd's value is finite, on a configuration of large inputs: an exp overflowed."""
    return (
        isinstance(actual, Tensor)
        and actual.shape == want.shape
        and "large" in label
        and bool(torch.isfinite(want).all())
        and not bool(torch.isfinite(actual.double()).all())
    )


def _candidates(spec: LayerSpec, c: Call, name: str) -> list:
    out = []
    for m in _formulas(spec):
        try:
            out.append(m.value(c.ctx).get(name))
        except Exception:  # a replay that cannot run on this configuration's shapes
            out.append(None)
    return out


def _parts_equal(mine, want: list[Tensor], tol: float) -> bool:
    return (
        isinstance(mine, list)
        and len(mine) == len(want)
        and all(same(a, b, tol) for a, b in zip(mine, want, strict=True))
    )


def _shapes(parts) -> str:
    if not isinstance(parts, list):
        return shape_of(parts)
    return "[" + ", ".join(shape_of(t) for t in parts) + "]"


def _as_dict(result, names: tuple[str, ...], what: str):
    if len(names) == 1:
        return {names[0]: result}
    if isinstance(result, (tuple, list)) and len(result) == len(names):
        return dict(zip(names, result, strict=True))
    got = f"{len(result)} things" if isinstance(result, (tuple, list)) else shape_of(result)
    raise LearnerFailed(f"{what} returned {got}; it must return a tuple ({', '.join(names)})")


def _plain(name: str, t) -> None:
    if isinstance(t, NotPlain):
        raise LearnerFailed(f"  {name} is {t}, not a plain torch.Tensor: return plain tensors", key="not-plain")


def unchanged(given: dict, originals: dict[str, Tensor], report: Report, mark, what=INPUT_IN_PLACE) -> bool:
    """Each of ``originals`` as ``given`` back after a call (bit for bit); else ``what`` named, UNCHANGED failed."""
    for n, t in originals.items():
        if not (isinstance(given.get(n), Tensor) and torch.equal(given[n], t)):
            report.fail("  " + what.says(n, "was"), what.key)
            mark(UNCHANGED, False, [what.key])
            return False
    mark(UNCHANGED, True)
    return True


def each_configuration(report: Report, labels: list[str], run) -> Report:
    """Run configuration after configuration, ``run(number, mark) -> right``, until one fails: ``mark`` marks the
    report's items on the default configuration (number 0) and nothing after it; each further configuration is an
    item of its own; a LearnerFailed is the failure it says; the first failure ends the walk, settled, its
    configuration named."""
    for number, label in enumerate(labels):
        since = len(report.log)
        try:
            ok = run(number, report.mark if number == 0 else _unmarked)
        except LearnerFailed as e:
            report.fail(e.text, e.key)
            ok = False
        if number:
            report.mark(CONFIG.format(number + 1, len(labels), label), ok)
        if not ok:
            report.settle(since)
            report.say(f"  (configuration {number + 1}, {label}, is the one that failed)")
            break
    return report


def _ruled_out(spec: LayerSpec, c: Call, names: list[str], wrong: list[str]) -> set[int]:
    """The known mistakes (indices into ``_formulas``) that cannot be this answer: each changes a tensor that is
    right here (a mistake that changes dx and weight.grad is not named for a wrong weight.grad beside a right dx)."""
    out = set()
    for i, m in enumerate(_formulas(spec)):
        try:
            replay = m.value(c.ctx)
        except Exception:
            continue
        for name, value in replay.items():
            if (
                name in names
                and name not in wrong
                and name in c.grads
                and isinstance(value, Tensor)
                and value.shape == c.grads[name].shape
                and rel_error(value, c.grads[name]) > 10 * RIGHT
            ):
                out.add(i)
                break
    return out


def _localise(spec: LayerSpec, names: list[str], wrong: list[str], k: int = 0, got=(), calls=()) -> str:
    """Where the pattern of right and wrong tensors points."""
    if (
        k
        and wrong
        and all(n.endswith(".grad") for n in wrong)
        and got
        and all(same(got[0].get(n), calls[0].grads[n], RIGHT) for n in wrong)
    ):
        return (
            f"-> {', '.join(wrong)} {'was' if len(wrong) == 1 else 'were'} right after the first backward: "
            f"{'its formula is' if len(wrong) == 1 else 'their formulas are'} right, the accumulation is not "
            f"(the second backward's gradient must be added to the first's)"
        )
    if len(names) < 2:
        return ""
    right = [n for n in names if n not in wrong]
    for group, where in spec.shared:
        members = [n for n in group if n in names]
        if members and all(n in wrong for n in members) and right:
            return f"-> {', '.join(right)} right, {', '.join(members)} wrong: they share {where}; look there first"
    if not right:
        return "-> every tensor is wrong: look at what they all use first (what forward kept, and dout)"
    if len(wrong) == 1:
        place = spec.where.get(wrong[0], "its line")
        return f"-> only {wrong[0]} is wrong: the mistake is in its own formula ({place})"
    return f"-> {', '.join(right)} right, {', '.join(wrong)} wrong"


def _formulas(spec: LayerSpec):
    return [m for m in spec.mistakes if m.value is not None]


def _stray(box, g: Tensor) -> str:
    for attr, v in box.request("stray", tuple(g.shape)).items():
        if isinstance(v, Tensor) and same(v, g, 1e-6):
            return f" (the right gradient is in self.{attr}: the checker, like an optimizer, reads .grad)"
    return ""


def _central(box, c: Call, name: str, index: tuple, h: float = 1e-6) -> float | None:
    return box.request("numeric", c.inputs, c.douts, tuple(c.outputs), name, index, h)


def _numeric_summary(box, c: Call) -> float | None:
    """The largest gap between autograd's gradients and central differences of the learner's forward, at the
    first, middle and last entry of each gradient (a few forwards each: cheap)."""
    gaps = []
    for name, g in c.grads.items():
        for flat in sorted({0, g.numel() // 2, g.numel() - 1}):
            index = unravel(flat, g.shape)
            num = _central(box, c, name, index)
            if num is None:
                return None
            gaps.append(abs(num - g[index].item()) / max(1.0, abs(g[index].item())))
    return max(gaps) if gaps else None
