"""Families of mistakes, named generically from an exercise's own right formulas, not one mistake at a time.

An exercise's spec gives ``formula(ctx)``: its backward written from named tensors (the saved ones, dout), every
sum through ``reduce_of(ctx)``; and ``saved``: the tensors a learner's backward may read, each with a few words.
Two families are replayed from it:

  * "the formula is right but uses saved tensor B where A belongs": the formula with ctx.A replaced by ctx.B,
    for every pair of saved tensors of one shape (df = dc * c_next for c, dweight from the output for xhat);
  * "summed over axis a where b belongs": the formula with one of its sums taken over another axis, kept only
    where broadcasting lets the result keep its shape (layer norm's dx summed over the batch, attention's
    softmax backward over the queries).

Each replay is a Mistake like the catalogue's, named only when it fits every configuration (naming.fits).
"""

from __future__ import annotations

from types import SimpleNamespace

from torch import Tensor

from ..mistakes import AXIS_FAMILY, SAVED_FAMILY, Mistake


class Reduce:
    """The sums of a formula, one call site after another: each over its own axis, or (a replay) site ``site``
    over ``axis`` instead.  ``seen`` records each site: (the summed tensor's dimensions, its axis, its label)."""

    def __init__(self, site: int | None = None, axis: int | None = None, keepdim: bool | None = None):
        self.site, self.axis, self.keepdim, self.count, self.seen = site, axis, keepdim, 0, []

    def sum(self, t: Tensor, dim, keepdim: bool = False, label: str = "", mean: bool = False) -> Tensor:
        j, self.count = self.count, self.count + 1
        self.seen.append((t.dim(), dim, keepdim, label))
        if j == self.site:
            dim = self.axis
            keepdim = keepdim if self.keepdim is None else self.keepdim
        return t.mean(dim, keepdim=keepdim) if mean else t.sum(dim, keepdim=keepdim)

    def mean(self, t: Tensor, dim, keepdim: bool = False, label: str = "") -> Tensor:
        return self.sum(t, dim, keepdim, label, mean=True)


def reduce_of(ctx) -> Reduce:
    """The Reduce a formula uses: the replay's, or a plain one."""
    return getattr(ctx, "_reduce", None) or Reduce()


def _with(ctx, **changes) -> SimpleNamespace:
    out = SimpleNamespace(**vars(ctx))
    vars(out).update(changes)
    return out


def _saved_case(spec, name: str, a: str, b: str) -> Mistake:
    what = spec.saved
    formula = f"its right formula with {b} where {a} belongs"
    why = f"{b} ({what[b]}) has the shape of {a} ({what[a]}), so nothing fails, but the formula needs {a}"
    return Mistake(SAVED_FAMILY.key, formula, why, lambda c: {name: spec.formula(_with(c, **{a: getattr(c, b)}))[name]})


def _axis_case(spec, name: str, site: int, axis: int, keepdim: bool, dims: int, was) -> Mistake:
    _, _, kept, label = was
    of = f" of {label}" if label else ""
    summed = f"({label})" if " " in label else label or "it"
    how = f"{summed}.sum({axis}{', keepdim=True' if keepdim else ''})"
    right = f"{summed}.sum({was[1] % dims}{', keepdim=True' if kept else ''})"
    formula = f"its right formula with the sum{of} over axis {axis} ({how} where {right} belongs)"
    return Mistake(
        AXIS_FAMILY.key,
        formula,
        AXIS_FAMILY.why,
        lambda c: {name: spec.formula(_with(c, _reduce=Reduce(site, axis, keepdim)))[name]},
    )


def family_mistakes(spec, name: str, ctx) -> list[Mistake]:
    """The family cases for tensor ``name`` on this configuration's ``ctx``: saved-tensor swaps first, then sums
    over another axis; [] where the exercise gives no formula."""
    formula = getattr(spec, "formula", None)
    if formula is None:
        return []
    probe = Reduce()
    try:
        if name not in formula(_with(ctx, _reduce=probe)):
            return []  # a tensor the formula does not give (a forward's output)
    except Exception:
        return []
    out = []
    tensors = {n: getattr(ctx, n, None) for n in spec.saved}
    for a, ta in tensors.items():
        for b, tb in tensors.items():
            if a != b and isinstance(ta, Tensor) and isinstance(tb, Tensor) and ta.shape == tb.shape:
                out.append(_saved_case(spec, name, a, b))
    for site, seen in enumerate(probe.seen):
        dims, was, kept, _ = seen
        if not isinstance(was, int):
            continue
        for axis in range(dims):
            if axis != was % dims:
                for keepdim in sorted({kept, True}):  # the learner's keepdim=True where none belongs, too
                    out.append(_axis_case(spec, name, site, axis, keepdim, dims, seen))
    return out
