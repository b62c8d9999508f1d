"""Checking a learner's layer: on each configuration, forward and backward twice, every tensor against autograd.

The walk, per configuration (configs.py): build the layer in the learner's process (sandbox.py), set its
parameters, then twice: forward (the output compared, the inputs must be left as they were), backward with a
random dout (each returned gradient and each ``.grad`` compared; the second call's ``.grad`` must hold both
calls' gradients; dout must be left as it was).  Expected values are computed here, from torch.autograd, and never
leave this process.  A wrong backward gets a table of every tensor, a line on where the pattern points, the
known mistake (naming.py), and central differences of the learner's own forward.  A right one must also agree
with central differences of that forward: a forward whose gradient is not the one it reports fails.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import Tensor

from ..mistakes import DOUT_IN_PLACE, INPUT_IN_PLACE
from .compare import RIGHT, SAME, describe, rel_error, same, shape_of, unravel, vjp
from .configs import expand
from .guard import LearnerFailed
from .intermediates import TRACES, compare, expected
from .naming import name_it, param_candidates
from .report import Report
from .sandbox import NotPlain
from .spec import F64, LayerSpec

CALLS = 2  # forward + backward twice: the second backward must add to the first's .grad
# the items of a report (Report.items), each a test of its own for a grader: on the default configuration
FORWARD, GRADIENT = "forward: {}", "gradient: {}"
ACCUMULATE = "accumulation: a second backward adds into each .grad"
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



def reference_call(spec: LayerSpec, params: dict[str, Tensor], inputs: dict[str, Tensor], g) -> Call:
    """The expected outputs and gradients of one forward/backward, from torch.autograd (its own leaves: nothing
    here depends on how a layer's tensors were made)."""
    with torch.enable_grad():
        leaves = {n: t.detach().clone().requires_grad_(t.is_floating_point() and n not in spec.constants)
                  for n, t in {**inputs, **params}.items()}
        outputs = spec.reference(SimpleNamespace(**leaves, **spec.ctor))
        if spec.loss:
            douts, grad_outputs = {}, [torch.ones((), dtype=F64)]
        else:  # random, never ones: the gradient of sum(out) through a normalisation is zero and passes anything
            douts = {f"d{o}": torch.randn(t.shape, generator=g, dtype=F64) for o, t in outputs.items()}
            grad_outputs = list(douts.values())
        wrt = [n for n, t in leaves.items() if t.requires_grad]
        found = vjp(list(outputs.values()), [leaves[n] for n in wrt], grad_outputs)
    grads = {}
    for n, d in zip(wrt, found):
        d = torch.zeros_like(leaves[n]) if d is None else d
        grads[f"{n}.grad" if n in params else f"d{n}"] = d.detach()
    ctx = SimpleNamespace(**{n: t.detach() for n, t in leaves.items()}, **douts, **spec.ctor,
                          **{o: t.detach() for o, t in outputs.items()}, expected=grads)
    if spec.context is not None:
        vars(ctx).update(spec.context(ctx))
    return Call(inputs, douts, {o: t.detach() for o, t in outputs.items()}, grads, ctx)


def items(spec: LayerSpec, outputs, grads, params) -> list[str]:
    """The items checked on the default configuration, then one per further configuration."""
    configs = expand(spec)
    names = ([LAYOUT] if spec.layout else []) + [FORWARD.format(o) for o in outputs]
    names += [GRADIENT.format(g) for g in grads]
    names += [ACCUMULATE] if params else []
    names += [UNCHANGED] + ([REPLICAS] if spec.replicas else []) + ([NUMERIC] if spec.numeric else [])
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
    report.right = (f"every tensor agrees with {spec.versus} on all {len(configs)} configurations, and with "
                    f"central differences of your forward")

    def run(number: int, mark) -> bool:
        label, cfg = configs[number]
        g = torch.Generator().manual_seed(cfg.seed)
        params = {n: make(g) for n, make in cfg.params.items()}
        calls = [reference_call(cfg, params, cfg.inputs(g), g) for _ in range(CALLS)]
        args = ", ".join(f"{k}={v!r}" for k, v in cfg.ctor.items())
        shapes = "; ".join(f"{n} {tuple(t.shape)}" for n, t in calls[0].inputs.items())
        report.say(f"  configuration {number + 1} of {len(configs)}, {label}: {box.cls_name}({args}) on {shapes}")
        if number == 0:
            report.plan(*items(spec, calls[0].outputs, _returns(cfg, calls[0]) + tuple(f"{p}.grad" for p in params),
                               params))
        return _walk(cfg, box, number, params, calls, report, mark)
    return each_configuration(report, [label for label, _ in configs], run)


def each_configuration(report: Report, labels: list[str], run: Callable[[int, Callable], bool]) -> Report:
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


def _unmarked(*args, **kwargs) -> None:
    """``mark`` after the default configuration: the items are that configuration's."""


def _walk(spec: LayerSpec, box, number: int, params: dict, calls: list[Call], report: Report, mark) -> bool:
    why = box.request("construct", number, params)
    if why is not None:
        report.fail("  " + why)
        return False
    errors: dict[str, float] = {}
    if spec.layout is not None and not _layout(spec, box, calls[0].ctx, report, mark):
        return False
    for k, c in enumerate(calls):
        if not _forward(spec, box, c, k, errors, report, mark) or not _backward(spec, box, params, calls, k, errors,
                                                                                report, mark):
            return False
        if spec.replicas and not _replicas(spec, box, report, mark):
            return False
    report.say("    right; the largest relative errors over two calls: "
               + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()))
    if spec.numeric:
        gap = _numeric_summary(spec, box, calls[-1])
        mark(NUMERIC, gap is None or gap <= NUMERIC_OK)
        if gap is not None and gap > NUMERIC_OK:
            report.fail(f"  central differences of your forward (h = 1e-6) disagree with the gradients by {gap:.0e} "
                        f"(a right layer agrees to about 1e-8): your forward does not compute the function whose "
                        f"gradient your backward returns (does it depend on how often it is called, or keep a result?)")
            return False
        if gap is not None:
            report.say(f"    central differences of your forward (h = 1e-6) agree with them to {gap:.0e}")
    return True


def _parts_equal(mine, want: list[Tensor], tol: float) -> bool:
    return isinstance(mine, list) and len(mine) == len(want) and all(same(a, b, tol) for a, b in zip(mine, want))


def _shapes(parts) -> str:
    if not isinstance(parts, list):
        return shape_of(parts)
    return "[" + ", ".join(shape_of(t) for t in parts) + "]"


def _layout(spec: LayerSpec, box, ctx, report: Report, mark) -> bool:
    """The learner's shards, one per rank, right after construction: each the expected block of its parameter."""
    want = spec.layout(ctx)
    got = box.request("probe", tuple(want))
    for path, parts in want.items():
        mine = got.get(path)
        if _parts_equal(mine, parts, RIGHT):
            continue
        report.fail(f"  layout is wrong: self.{path} should hold {len(parts)} shards, one per rank, of shapes "
                    f"{_shapes(parts)}, each the block of the parameter that rank holds; yours: {_shapes(mine)}")
        for m, alt in spec.layout_mistakes:
            if _parts_equal(mine, alt(ctx).get(path), SAME):
                report.fail("  -> " + m.says(f"self.{path}", "is"), m.key)
                mark(LAYOUT, False, [m.key])
                return False
        if isinstance(mine, list) and [shape_of(t) for t in mine] == [shape_of(t) for t in parts]:
            report.say("  -> the shapes are right, the values are not: is each shard a view of the parameter "
                       "(shard() gives views)?  The checker sets the parameters after the constructor, and a "
                       "copy never sees them")
        mark(LAYOUT, False)
        return False
    mark(LAYOUT, True)
    return True


def _replicas(spec: LayerSpec, box, report: Report, mark) -> bool:
    """After a forward and backward: each list of per-rank results holds one value on every rank."""
    for path, parts in box.request("probe", spec.replicas).items():
        if not isinstance(parts, list) or not parts:
            report.fail(f"  self.{path} is {shape_of(parts)}: it should be a list with one tensor per rank")
            mark(REPLICAS, False)
            return False
        for r, t in enumerate(parts[1:], 1):
            if not same(t, parts[0], RIGHT):
                report.fail(f"  rank {r}'s {path} differs from rank 0's: after an all-reduce every rank holds the "
                            f"same sum.  " + describe(f"{path}[{r}]", t, parts[0]))
                mark(REPLICAS, False)
                return False
    mark(REPLICAS, True)
    return True


def _as_dict(result, names: tuple[str, ...], what: str):
    if len(names) == 1:
        return {names[0]: result}
    if isinstance(result, (tuple, list)) and len(result) == len(names):
        return dict(zip(names, result))
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


def _forward(spec, box, c: Call, k: int, errors, report, mark) -> bool:
    result, given = box.request("forward", c.inputs)
    what = f"{box.cls_name}.forward"
    outs = _as_dict(result, tuple(c.outputs), what)
    if not unchanged(given, c.inputs, report, mark):
        return False
    for name, want in c.outputs.items():
        actual = outs[name]
        _plain(name, actual)
        if same(actual, want, RIGHT):
            errors[name] = max(errors.get(name, 0.0), rel_error(actual, want))
            mark(FORWARD.format(name), True)
            continue
        mark(FORWARD.format(name), False)
        report.fail(f"  forward is wrong.  {describe(name, actual, want)}")
        name_it(spec, name, actual, [m.value(c.ctx).get(name) for m in _formulas(spec)], report, c, want)
        return False
    return True


def _backward(spec, box, params, calls: list[Call], k: int, errors, report, mark) -> bool:
    c = calls[k]
    returns = _returns(spec, c)
    what = f"{box.cls_name}.backward"
    try:
        result, given, pgrads, inputs_after = box.request("backward", c.douts)
    except LearnerFailed as e:
        report.fail(e.text, e.key)
        for pname, value in e.attempted.items():  # what the failing line tried to add into .grad
            name = f"{pname}.grad"
            if value.shape != c.grads[name].shape:
                report.say(f"  that line tried to put a tensor of shape {tuple(value.shape)} into {name} "
                           f"{tuple(c.grads[name].shape)}")
            name_it(spec, name, value, [m.value(c.ctx).get(name) for m in _formulas(spec)], report, c,
                    c.grads[name], quiet=True)
        return False
    got = _as_dict(result, returns, what) if returns else {}
    saved = _intermediates(spec, box, c, params) if k == 0 else []
    ok = unchanged(given, c.douts, report, mark, DOUT_IN_PLACE) and unchanged(inputs_after, c.inputs, report, mark)
    rows = []  # (name, actual, want, candidates): want is autograd's
    for name in returns:
        rows.append((name, got[name], c.grads[name], [m.value(c.ctx).get(name) for m in _formulas(spec)]))
    for p in params:
        name = f"{p}.grad"
        rows.append((name, pgrads[p], sum(calls[j].grads[name] for j in range(k + 1)),
                     param_candidates(spec, calls, k, name, _formulas(spec))))
    wrong = []
    for name, actual, want, _ in rows:
        _plain(name, actual)
        right = same(actual, want, RIGHT)
        mark(ACCUMULATE if k and name.endswith(".grad") else GRADIENT.format(name), right)
        if right:
            errors[name] = max(errors.get(name, 0.0), rel_error(actual, want))
        else:
            wrong.append(name)
    if saved and (spec.label == "the default" or wrong):
        report.say("    your self.saved, beside autograd's on the same forward (call 1):")
        for line in saved:
            report.say(line)
    if not wrong:
        return ok
    when = "" if k == 0 else " after the second forward/backward (a .grad must hold the sum of both calls')"
    report.fail(f"  backward is wrong{when}.  Each tensor (the relative error is the tensor's: its largest "
                f"difference over its largest entry):")
    for name, actual, want, _ in rows:
        if name in wrong:
            if actual is None and name.endswith(".grad"):
                report.say(f"    WRONG  {name} is None: your backward must add the gradient into self.{name} "
                           f"(creating it when it is None)" + _stray(box, want))
            else:
                report.say(f"    WRONG  {describe(name, actual, want)}")
        else:
            report.say(f"    right  {name} (relative error {rel_error(actual, want):.1e})")
    line = _localise(spec, [r[0] for r in rows], wrong)
    if line:
        report.say("  " + line)
    first = True
    ruled_out = _ruled_out(spec, c, [r[0] for r in rows], wrong)
    for name, actual, want, candidates in rows:
        if name in wrong and actual is not None:
            candidates = [None if i in ruled_out else cand for i, cand in enumerate(candidates)]
            name_it(spec, name, actual, candidates, report, c, want, quiet=not first, k=k,
                    numeric=(lambda index: _central(spec, box, c, name, index)) if first else None)
            first = False
    return False


def _ruled_out(spec: LayerSpec, c: Call, names: list[str], wrong: list[str]) -> set[int]:
    """The known mistakes (indices into ``_formulas``) that cannot be this answer: each changes a tensor that is
    right here (a mistake that changes dx and weight.grad is not named for a wrong weight.grad beside a right dx)."""
    out = set()
    for i, m in enumerate(_formulas(spec)):
        for name, value in m.value(c.ctx).items():
            if name in names and name not in wrong and name in c.grads and isinstance(value, Tensor) \
                    and value.shape == c.grads[name].shape and rel_error(value, c.grads[name]) > 10 * RIGHT:
                out.add(i)
                break
    return out


def _intermediates(spec: LayerSpec, box, c: Call, params: dict) -> list[str]:
    """What the learner recorded in self.saved (opt-in), each beside autograd's intermediate: the lines."""
    trace = TRACES.get(spec.name)
    saved = box.request("saved") if trace is not None else {}
    if not saved:
        return []
    return compare(saved, expected(trace, {**c.inputs, **params}, spec.ctor, c.douts, spec.loss))


def _localise(spec: LayerSpec, names: list[str], wrong: list[str]) -> str:
    """Where the pattern of right and wrong tensors points."""
    if len(names) < 2:
        return ""
    right = [n for n in names if n not in wrong]
    for group, where in spec.shared:
        members = [n for n in group if n in names]
        if members and all(n in wrong for n in members) and right:
            return (f"-> {', '.join(right)} right, {', '.join(members)} wrong: they share {where}; look there "
                    f"first")
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


def _central(spec, box, c: Call, name: str, index: tuple, h: float = 1e-6) -> float | None:
    return box.request("numeric", c.inputs, c.douts, tuple(c.outputs), name, index, h)


def _numeric_summary(spec, box, c: Call) -> float | None:
    """The largest gap between autograd's gradients and central differences of the learner's forward, at the
    first, middle and last entry of each gradient (a few forwards each: cheap)."""
    gaps = []
    for name, g in c.grads.items():
        for flat in sorted({0, g.numel() // 2, g.numel() - 1}):
            index = unravel(flat, g.shape)
            num = _central(spec, box, c, name, index)
            if num is None:
                return None
            gaps.append(abs(num - g[index].item()) / max(1.0, abs(g[index].item())))
    return max(gaps) if gaps else None

