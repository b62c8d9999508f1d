"""Naming the mistake: only when it is true, on all the evidence.

A known mistake is named when its replay, on the same inputs, is clearly closer to the learner's tensor than the
right answer is (within SAME of it, and a hundred times closer than the right one), and the replay itself differs
from the right answer by more than the pass tolerance: at a setting where the wrong formula happens to give the
right numbers, it is not named.  And it must fit every configuration (``Evidence``: the first call of each): where
the learner's tensor is right, the mistake must give the right numbers too; where it is wrong, the mistake must
give the learner's numbers; a tensor the mistake changes that is right in the learner's answer rules it out.  The
first configuration that fits is never enough: the name that fits them all is given, or none, and the report says
what the difference looks like (compare.diagnose).

Besides the catalogue's mistakes, each exercise's families (families.py) are tried the same way: its right
formulas replayed with one saved tensor in place of another of its shape, or with one sum over another axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import Tensor

from ..mistakes import DOUBLED, OVERWRITE
from .compare import RIGHT, SAME, diagnose, rel_error, worst

CLEARLY = 0.01  # the replay must be this much closer to the learner's answer than the right answer is


@dataclass
class Evidence:
    """One configuration's first call: its context (for replays), the learner's tensors, autograd's."""

    ctx: SimpleNamespace
    mine: dict
    want: dict[str, Tensor]
    label: str = ""


def matches(actual, replay, expected: Tensor) -> bool:
    """Is ``actual`` the replay of a mistake, and not the right answer, in the sense above?"""
    if not isinstance(actual, Tensor) or not isinstance(replay, Tensor) or replay.shape != actual.shape:
        return False
    if replay.shape == expected.shape and rel_error(replay, expected) <= 10 * RIGHT:
        return False  # here the wrong formula gives the right numbers
    bad = ~torch.isfinite(actual.double())
    if bad.any():  # a nan where the mistake gives one too (a fully masked row): compare what is finite
        if not torch.equal(bad, ~torch.isfinite(replay.double())):
            return False
        actual, replay = actual.double().masked_fill(bad, 0.0), replay.double().masked_fill(bad, 0.0)
        return rel_error(actual, replay) < SAME
    to_replay = rel_error(actual, replay)
    return to_replay < SAME and to_replay < CLEARLY * rel_error(actual, expected)


def _right(t, expected: Tensor) -> bool:
    return isinstance(t, Tensor) and t.shape == expected.shape and rel_error(t, expected) <= 10 * RIGHT


def fits(m, tensor: str, evidence: list[Evidence]) -> bool:
    """Does mistake ``m`` explain the learner's ``tensor`` in every configuration, and contradict none of the
    tensors it changes?  (A configuration where its replay cannot run, or the learner's tensor is missing, says
    nothing; the caller has seen it match where it is named.)"""
    for ev in evidence:
        try:
            replay = m.value(ev.ctx)
        except Exception:
            replay = None
        if not isinstance(replay, dict):
            if _right(ev.mine.get(tensor), ev.want.get(tensor)) if tensor in ev.want else False:
                return False  # the mistake cannot even run here, and the learner's tensor is right
            continue
        for name, value in replay.items():
            if value is None or name not in ev.want or not isinstance(ev.mine.get(name), Tensor):
                continue  # the mistake says nothing of this tensor here (it gives the right one, or cannot be)
            actual, want = ev.mine[name], ev.want[name]
            if name.endswith(".grad") and isinstance(value, Tensor) and value.shape != want.shape:
                value = _broadcast(value, want.shape)  # p.grad += g broadcasts a (1,) g into p.grad
            if _right(actual, want):
                if not _right(value, want):
                    return False  # the mistake would have made a right tensor wrong
            elif name == tensor:
                if (
                    not torch.isfinite(actual.double()).all()
                    and isinstance(value, Tensor)
                    and bool(torch.isfinite(value.double()).all())
                ):
                    continue  # nan or inf from the learner's arithmetic (an overflow): a replay cannot say
                if not matches(actual, value, want):
                    return False
    return True


def _broadcast(t: Tensor, shape) -> Tensor:
    try:
        return torch.broadcast_to(t, shape).clone()
    except RuntimeError:
        return t


def param_candidates(spec, calls, k: int, name: str, formulas) -> list:
    """What .grad holds after call k under each known mistake (a wrong formula, accumulated or overwritten)."""
    per_call = []
    for j in range(k + 1):
        row = []
        for m in formulas:
            try:
                row.append(m.value(calls[j].ctx).get(name))
            except Exception:
                row.append(None)
        per_call.append(row)
    out = []
    for i in range(len(formulas)):
        vals = [per_call[j][i] for j in range(k + 1)]
        if any(v is None for v in vals):
            out.append(None)
        elif k == 0 or all(v.shape == vals[0].shape for v in vals):
            out.append(vals if k else vals[0])
        else:
            out.append(None)
    return out


def name_it(
    spec,
    name,
    actual,
    candidates,
    report,
    c,
    expected: Tensor,
    quiet=False,
    k: int = 0,
    numeric=None,
    evidence: list[Evidence] | None = None,
) -> None:
    """Say which known mistake ``actual`` is; failing that (unless ``quiet``), what the difference looks like,
    and central differences of the learner's forward at the worst entry (``numeric(index)``).  ``evidence``:
    every configuration's, which a named mistake must fit."""
    from .families import family_mistakes

    formulas = [m for m in spec.mistakes if m.value is not None]
    for m, cand in zip(formulas, candidates, strict=True):
        # a list: the formula's value at each call so far, accumulated (right) or overwritten by the last call
        options = [sum(cand), cand[-1]] if isinstance(cand, list) else [cand]
        if any(o is not None and matches(actual, o, expected) for o in options) and (
            evidence is None or k > 0 or fits(m, name, evidence)
        ):
            report.fail("  -> " + m.says(name), m.key)
            return
    if name.endswith(".grad") and isinstance(actual, Tensor):
        one = c.grads[name]
        if k == 0 and matches(actual, 2 * one, expected):
            report.fail("  -> " + DOUBLED.says(name), DOUBLED.key)
            return
        if k > 0 and matches(actual, one, expected):
            report.fail("  -> " + OVERWRITE.says(name), OVERWRITE.key)
            return
    if k == 0 and evidence:
        for m in family_mistakes(spec, name, c.ctx):
            try:
                replay = m.value(c.ctx).get(name)
            except Exception:
                continue
            if matches(actual, replay, expected) and fits(m, name, evidence):
                report.fail("  -> " + m.says(name), m.key)
                return
    if quiet:
        if (
            isinstance(actual, Tensor)
            and name in c.grads
            and actual.shape == c.grads[name].shape
            and rel_error(actual, c.grads[name]) < RIGHT
            and rel_error(actual, expected) > RIGHT
        ):
            report.say(f"  (that is the right gradient: the trouble is in how it is added into {name})")
        return
    for line in diagnose(name, actual, expected, {**c.grads, **c.outputs}, spec.nan_hint):
        report.say("  -> " + line)
    if numeric is not None and isinstance(actual, Tensor) and actual.shape == expected.shape:
        index, e, _ = worst(actual, expected)
        num = numeric(index)
        if num is not None:
            agrees = abs(num - e) <= 1e-5 * max(1.0, abs(e))
            report.say(
                f"  central differences of your own forward there give {num:.8g}"
                + (" = the expected value: your forward is right, the backward differs from it" if agrees else "")
            )
    if name in spec.where:
        report.say(f"  look at: {spec.where[name]}")
