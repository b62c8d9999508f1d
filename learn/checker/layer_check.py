"""Checking a learner's layer: forward, backward twice, every tensor against autograd, and the mistake named.

The walk: build the layer, set its parameters to the spec's values, then twice: forward (the output compared,
the inputs must be left as they were), backward with a random dout (each returned gradient and each ``.grad``
compared; the second call's ``.grad`` must hold both calls' gradients, added; dout must be left as it was).  The
first wrong tensor stops the walk: the report gives its shape or worst entry, then the known mistake it equals,
else what the difference looks like, central differences of the learner's own forward there, and where to look.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import Tensor

from ..mistakes import DOUBLED, DOUT_IN_PLACE, INPUT_IN_PLACE, OVERWRITE
from .compare import RIGHT, describe, diagnose, rel_error, same, shape_of
from .guard import LearnerFailed, call
from .report import Report
from .spec import F64, LayerSpec

CALLS = 2  # forward + backward twice: the second backward must add to the first's .grad


@dataclass
class Call:
    inputs: dict[str, Tensor]
    douts: dict[str, Tensor]
    outputs: dict[str, Tensor]
    grads: dict[str, Tensor]  # expected: "dx" for an input x, "weight.grad" for a parameter
    ctx: SimpleNamespace  # everything, by name, for the mistakes' formulas


def reference_call(spec: LayerSpec, params: dict[str, Tensor], inputs: dict[str, Tensor], g) -> Call:
    """The expected outputs and gradients of one forward/backward, from torch.autograd."""
    leaves = {n: t.clone().requires_grad_(t.is_floating_point() and n not in spec.constants)
              for n, t in {**inputs, **params}.items()}
    outputs = spec.reference(SimpleNamespace(**leaves))
    if spec.loss:
        douts, grad_outputs = {}, [torch.ones((), dtype=F64)]
    else:  # random, never ones: the gradient of sum(out) through a normalisation is zero and passes anything
        douts = {f"d{o}": torch.randn(t.shape, generator=g, dtype=F64) for o, t in outputs.items()}
        grad_outputs = list(douts.values())
    wrt = [n for n, t in leaves.items() if t.requires_grad]
    found = torch.autograd.grad(list(outputs.values()), [leaves[n] for n in wrt], grad_outputs, allow_unused=True)
    grads = {}
    for n, d in zip(wrt, found):
        d = torch.zeros_like(leaves[n]) if d is None else d
        grads[f"{n}.grad" if n in params else f"d{n}"] = d.detach()
    ctx = SimpleNamespace(**{n: t.detach() for n, t in leaves.items()}, **douts,
                          **{o: t.detach() for o, t in outputs.items()}, expected=grads)
    if spec.context is not None:
        vars(ctx).update(spec.context(ctx))
    return Call(inputs, douts, {o: t.detach() for o, t in outputs.items()}, grads, ctx)


def check_layer(spec: LayerSpec, cls: type, where: str | None) -> Report:
    g = torch.Generator().manual_seed(spec.seed)
    params = {n: make(g) for n, make in spec.params.items()}
    calls = [reference_call(spec, params, spec.inputs(g), g) for _ in range(CALLS)]
    args = ", ".join(f"{k}={v!r}" for k, v in spec.ctor.items())
    shapes = "; ".join(f"{n} {tuple(t.shape)}" for n, t in calls[0].inputs.items())
    report = Report(f"Checking {cls.__name__}({args}) of exercise {spec.name}, on {shapes}")
    try:
        _walk(spec, cls, params, calls, where, report)
    except LearnerFailed as e:
        report.fail(e.text, e.key)
    return report


def _walk(spec: LayerSpec, cls: type, params: dict, calls: list[Call], where: str | None, report: Report) -> None:
    obj = call(f"{cls.__name__}({', '.join(f'{k}={v!r}' for k, v in spec.ctor.items())})",
               lambda: cls(**spec.ctor), where=where)
    if not _install(obj, params, report):
        return
    if params:
        report.say("  parameters set to random values away from their defaults: "
                   + ", ".join(f"{n} {tuple(t.shape)}" for n, t in params.items()))
    ids = {id(getattr(obj, n)): n for n in params}
    errors: dict[str, float] = {}
    for k, c in enumerate(calls):
        given = _forward(spec, obj, c, k, where, errors, report)
        if given is None or not _backward(spec, obj, params, calls, k, where, ids, errors, report):
            return
        if not _unchanged(given, c.inputs, report):  # a backward that wrote into the input it kept
            return
    report.say("  every tensor agrees with autograd; the largest relative errors over two calls: "
               + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()))
    if params:
        report.say("  the second backward added its gradients into .grad (+=), as PyTorch does")
    gap = _numeric_summary(spec, obj, calls[-1])
    if gap is not None:
        report.say(f"  central differences of your forward (h = 1e-6) agree with them to {gap:.0e} at three entries "
                   f"of each gradient (they are good to about 1e-8)")


def _install(obj, params: dict[str, Tensor], report: Report) -> bool:
    """Copy the checked values into the learner's own parameter tensors (shapes and dtype checked first)."""
    for n, value in params.items():
        mine = getattr(obj, n, None)
        if not isinstance(mine, Tensor):
            report.fail(f"your {type(obj).__name__} has no tensor attribute {n} (got {shape_of(mine)}); the checker "
                        f"reads the parameters by PyTorch's names: {', '.join(params)}")
            return False
        if mine.shape != value.shape or mine.dtype != F64:
            report.fail(f"your {n} is {mine.dtype} of shape {tuple(mine.shape)}; expected float64 of shape "
                        f"{tuple(value.shape)} (the constructor makes it)")
            return False
        with torch.no_grad():
            mine.copy_(value)
        mine.grad = None
    return True


def _as_dict(result, names: tuple[str, ...], what: str):
    if len(names) == 1:
        return {names[0]: result}
    if isinstance(result, (tuple, list)) and len(result) == len(names):
        return dict(zip(names, result))
    got = f"{len(result)} things" if isinstance(result, (tuple, list)) else shape_of(result)
    raise LearnerFailed(f"{what} returned {got}; it must return a tuple ({', '.join(names)})")


def _unchanged(given: dict[str, Tensor], originals: dict[str, Tensor], report: Report) -> bool:
    for n, t in originals.items():
        if not torch.equal(given[n], t):
            report.fail("  " + INPUT_IN_PLACE.says(n, "was"), INPUT_IN_PLACE.key)
            return False
    return True


def _forward(spec, obj, c: Call, k: int, where, errors, report) -> dict[str, Tensor] | None:
    """Run the learner's forward on copies of the inputs and compare; -> the copies it got, None when wrong."""
    given = {n: t.clone() for n, t in c.inputs.items()}
    what = f"{type(obj).__name__}.forward"
    outs = _as_dict(call(what, spec.forward, obj, given, where=where), tuple(c.outputs), what)
    if not _unchanged(given, c.inputs, report):
        return None
    for name, expected in c.outputs.items():
        actual = outs[name]
        if same(actual, expected, RIGHT):
            errors[name] = max(errors.get(name, 0.0), rel_error(actual, expected))
            continue
        report.fail(f"  forward is wrong.  {describe(name, actual, expected)}")
        _name_it(spec, name, actual, [m.value(c.ctx).get(name) for m in _formulas(spec)], report, c, k)
        return None
    return given


def _backward(spec, obj, params, calls: list[Call], k: int, where, ids, errors, report) -> bool:
    c = calls[k]
    given = {n: t.clone() for n, t in c.douts.items()}
    returns = spec.returns if spec.returns is not None else tuple(n for n in c.grads if not n.endswith(".grad"))
    what = f"{type(obj).__name__}.backward"
    try:
        result = call(what, spec.backward, obj, given, where=where, params=ids)
    except LearnerFailed as e:
        report.fail(e.text, e.key)
        for pname, value in e.attempted.items():  # what the failing line tried to add into .grad
            name = f"{pname}.grad"
            if value.shape != c.grads[name].shape:
                report.say(f"  that line tried to put a tensor of shape {tuple(value.shape)} into {name} "
                           f"{tuple(c.grads[name].shape)}")
            _name_it(spec, name, value, [m.value(c.ctx).get(name) for m in _formulas(spec)], report, c, k,
                     quiet=True)
        return False
    got = _as_dict(result, returns, what) if returns else {}
    ok = True
    for n, t in c.douts.items():
        if not torch.equal(given[n], t):
            report.fail("  " + DOUT_IN_PLACE.says(n, "was"), DOUT_IN_PLACE.key)
            ok = False
    for name in returns:
        actual, expected = got[name], c.grads[name]
        if same(actual, expected, RIGHT):
            errors[name] = max(errors.get(name, 0.0), rel_error(actual, expected))
            continue
        report.fail(f"  backward is wrong.  {describe(name, actual, expected)}")
        _name_it(spec, name, actual, [m.value(c.ctx).get(name) for m in _formulas(spec)], report, c, k, obj=obj)
        return False
    for p in params:
        name = f"{p}.grad"
        actual, expected = getattr(obj, p).grad, sum(calls[j].grads[name] for j in range(k + 1))
        if same(actual, expected, RIGHT):
            errors[name] = max(errors.get(name, 0.0), rel_error(actual, expected))
            continue
        if actual is None:
            report.fail(f"  {name} is None after backward: your backward must add the gradient of {p} into "
                        f"self.{p}.grad (creating it when it is None)" + _stray(obj, c.grads[name]))
            return False
        when = "" if k == 0 else " after the second forward/backward (it must hold the sum of both calls' gradients)"
        report.fail(f"  backward is wrong{when}.  {describe(name, actual, expected)}")
        candidates = _param_candidates(spec, calls, k, name)
        _name_it(spec, name, actual, candidates, report, c, k, obj=obj)
        return False
    return ok


def _formulas(spec: LayerSpec):
    return [m for m in spec.mistakes if m.value is not None]


def _param_candidates(spec: LayerSpec, calls: list[Call], k: int, name: str) -> list:
    """What .grad holds after call k under each known mistake (a wrong formula, accumulated or overwritten)."""
    per_call = [[m.value(calls[j].ctx).get(name) for m in _formulas(spec)] for j in range(k + 1)]
    out = []
    for i in range(len(_formulas(spec))):
        vals = [per_call[j][i] for j in range(k + 1)]
        if any(v is None for v in vals):
            out.append(None)
        elif k == 0 or all(v.shape == vals[0].shape for v in vals):
            out.append(vals if k else vals[0])
        else:
            out.append(None)
    return out


def _name_it(spec, name, actual, candidates, report, c: Call, k: int, obj=None, quiet=False) -> None:
    """Say which known mistake ``actual`` equals; failing that, what the difference looks like."""
    for m, cand in zip(_formulas(spec), candidates):
        # a list: the formula's value at each call so far, accumulated (right) or overwritten by the last call
        options = [sum(cand), cand[-1]] if isinstance(cand, list) else [cand]
        if any(o is not None and same(actual, o) and not same(o, _expected(c, name, k)) for o in options):
            report.fail("  -> " + m.says(name), m.key)
            return
    if name.endswith(".grad") and isinstance(actual, Tensor):
        if k == 0 and same(actual, 2 * c.grads[name]):
            report.fail("  -> " + DOUBLED.says(name), DOUBLED.key)
            return
        if k > 0 and same(actual, c.grads[name]):
            report.fail("  -> " + OVERWRITE.says(name), OVERWRITE.key)
            return
    if quiet:
        if isinstance(actual, Tensor) and same(actual, c.grads.get(name, torch.empty(0))):
            report.say(f"  (that is the right gradient: the trouble is in how it is added into {name})")
        return
    expected = _expected(c, name, k)
    for line in diagnose(name, actual, expected, {**c.grads, **c.outputs}):
        report.say("  -> " + line)
    if obj is not None and isinstance(actual, Tensor) and actual.shape == expected.shape:
        _numeric(spec, obj, c, name, actual, expected, report)
    if name in spec.where:
        report.say(f"  look at: {spec.where[name]}")


def _expected(c: Call, name: str, k: int) -> Tensor:
    return c.outputs[name] if name in c.outputs else c.grads[name]


def _stray(obj, g: Tensor) -> str:
    for attr, v in vars(obj).items():
        if isinstance(v, Tensor) and v.shape == g.shape and same(v, g, 1e-6):
            return f" (the right gradient is in self.{attr}: the checker, like an optimizer, reads .grad)"
    return ""


def central_difference(spec, obj, c: Call, name: str, index: tuple, h: float = 1e-6) -> float | None:
    """d(sum of outputs * douts)/d name[index] by central differences of the learner's own forward (None if it
    raises); ``name`` is an input's gradient ("dx") or a parameter's ("weight.grad")."""
    if name.endswith(".grad"):
        t, inputs = getattr(obj, name[:-5]), c.inputs
    else:
        inputs = {n: v.clone() for n, v in c.inputs.items()}
        t = inputs[name[1:]]
    orig = t[index].item()
    values = []
    try:
        for step in (h, -h):
            with torch.no_grad():
                t[index] = orig + step
            outs = _as_dict(spec.forward(obj, {n: v.clone() for n, v in inputs.items()}), tuple(c.outputs), "")
            values.append(sum((outs[o] * c.douts[f"d{o}"]).sum().item() if c.douts else outs[o].item()
                              for o in c.outputs))
    except Exception:
        return None
    finally:
        with torch.no_grad():
            t[index] = orig
    return (values[0] - values[1]) / (2 * h)


def _numeric(spec, obj, c: Call, name: str, actual: Tensor, expected: Tensor, report: Report) -> None:
    """Central differences of the learner's own forward at the worst entry: does the backward match it?"""
    from .compare import worst
    index, e, _ = worst(actual, expected)
    num = central_difference(spec, obj, c, name, index)
    if num is None:
        return
    agrees = abs(num - e) <= 1e-5 * max(1.0, abs(e))
    report.say(f"  central differences of your own forward there give {num:.8g}" +
               (" = the expected value: your forward is right, the backward differs from it" if agrees else ""))


def _numeric_summary(spec, obj, c: Call) -> float | None:
    """The largest gap between autograd's gradients and central differences of the learner's forward, at the
    first, middle and last entry of each gradient (a few forwards each: cheap)."""
    gaps = []
    for name, g in c.grads.items():
        for flat in sorted({0, g.numel() // 2, g.numel() - 1}):
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), g.shape)) if g.dim() else ()
            num = central_difference(spec, obj, c, name, index)
            if num is None:
                return None
            gaps.append(abs(num - g[index].item()) / max(1.0, abs(g[index].item())))
    return max(gaps) if gaps else None
