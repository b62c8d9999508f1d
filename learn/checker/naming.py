"""Naming the mistake: only when it is true.

A known mistake is named when its replay, on the same inputs, is clearly closer to the learner's tensor than the
right answer is (within SAME of it, and a hundred times closer than the right one), and the replay itself differs
from the right answer by more than the pass tolerance: at a setting where the wrong formula happens to give the
right numbers, it is not named.  Otherwise the report says what the difference looks like (compare.diagnose).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..mistakes import DOUBLED, OVERWRITE
from .compare import RIGHT, SAME, diagnose, rel_error, worst

CLEARLY = 0.01  # the replay must be this much closer to the learner's answer than the right answer is


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


def param_candidates(spec, calls, k: int, name: str, formulas) -> list:
    """What .grad holds after call k under each known mistake (a wrong formula, accumulated or overwritten)."""
    per_call = [[m.value(calls[j].ctx).get(name) for m in formulas] for j in range(k + 1)]
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


def name_it(spec, name, actual, candidates, report, c, expected: Tensor, quiet=False, k: int = 0,
            numeric=None) -> None:
    """Say which known mistake ``actual`` is; failing that (unless ``quiet``), what the difference looks like,
    and central differences of the learner's forward at the worst entry (``numeric(index)``)."""
    formulas = [m for m in spec.mistakes if m.value is not None]
    for m, cand in zip(formulas, candidates):
        # a list: the formula's value at each call so far, accumulated (right) or overwritten by the last call
        options = [sum(cand), cand[-1]] if isinstance(cand, list) else [cand]
        if any(o is not None and matches(actual, o, expected) for o in options):
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
    if quiet:
        if isinstance(actual, Tensor) and name in c.grads and actual.shape == c.grads[name].shape \
                and rel_error(actual, c.grads[name]) < RIGHT and rel_error(actual, expected) > RIGHT:
            report.say(f"  (that is the right gradient: the trouble is in how it is added into {name})")
        return
    for line in diagnose(name, actual, expected, {**c.grads, **c.outputs}, spec.nan_hint):
        report.say("  -> " + line)
    if numeric is not None and isinstance(actual, Tensor) and actual.shape == expected.shape:
        index, e, _ = worst(actual, expected)
        num = numeric(index)
        if num is not None:
            agrees = abs(num - e) <= 1e-5 * max(1.0, abs(e))
            report.say(f"  central differences of your own forward there give {num:.8g}" +
                       (" = the expected value: your forward is right, the backward differs from it" if agrees
                        else ""))
    if name in spec.where:
        report.say(f"  look at: {spec.where[name]}")

