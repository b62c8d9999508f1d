"""The catalogue of known mistakes: what each computes, and the plain words that name it.

A ``Mistake`` recomputes, for one check's inputs, what a learner's answer would be under a known wrong
formula (``value``: the case's tensors in, the wrong tensors out, by name).  When a learner's tensor equals
one of them, the checker says so with ``says``.  The mistakes of each exercise live with its checks in
``learn/checker/specs/``; the ones every layer can make (``=`` where ``+=`` belongs, dout changed in place,
...) are here.  ``learn.checker.specs.catalogue()`` lists them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Mistake:
    key: str  # a short, stable id: "bias-mean"
    formula: str  # what the learner wrote, as they would write it: "dout.mean(0)"
    why: str  # what is wrong with it, in plain words
    value: Callable | None = None  # ctx -> {tensor name: the wrong value}; None: detected by other means

    def says(self, tensor: str, verb: str = "equals") -> str:
        return f"your {tensor} {verb} {self.formula}: {self.why}"


# -- mistakes any layer with parameters can make: found by the runner, not by a formula --------------------------

OVERWRITE = Mistake(
    "grad-overwritten",
    "the second backward's gradient alone (p.grad = g)",
    "the first backward's gradient is gone.  Gradients accumulate, as PyTorch's do: a layer used twice, or two "
    "micro-batches, must add up.  Write p.grad += g (after creating p.grad as zeros when it is None), not "
    "p.grad = g",
)
DOUBLED = Mistake(
    "grad-doubled",
    "twice the gradient on the first backward",
    "when .grad was None you set it to g and then added g again.  Create it as zeros (p.grad = "
    "torch.zeros_like(p)) and then add, or set it *else* add",
)
GRAD_NONE = Mistake(
    "grad-none-not-created",
    "None += g",
    ".grad is None until the first backward; create it first: if p.grad is None: p.grad = torch.zeros_like(p), "
    "then p.grad += g",
)
DOUT_IN_PLACE = Mistake(
    "dout-changed-in-place",
    "changed in place by your backward",
    "it wrote into dout (an in-place operation such as dout[mask] = 0, dout *= ..., or .mul_()).  In "
    "a network the same dout may feed another branch, and the caller's tensor is not yours to change: compute a "
    "new tensor (dx = dout * mask)",
)
INPUT_IN_PLACE = Mistake(
    "input-changed-in-place",
    "changed in place by your layer",
    "it wrote into its input (x[x < 0] = 0, x.clamp_(...), x -= ..., in forward or in backward).  "
    "The caller still needs it (the "
    "layer before keeps it for its own backward): compute a new tensor instead",
)
CACHE_CHANGED = Mistake(
    "cache-changed-in-place",
    "other gradients on a second backward after the same forward",
    "the first backward after a forward is right, the next is not: your backward changed a tensor its forward "
    "kept (self.diff *= 2, dlogits = self.p then dlogits[...] -= 1, s *= 1 - s: an in-place operation on the "
    "cache, or on a name bound to it).  A layer must give the same answer twice: compute new tensors (dlogits = "
    "self.p.clone(), or s * (1 - s))",
)
OVERFLOW = Mistake(
    "exp-overflow",
    "nan or inf where the function is finite, for large inputs",
    "an exp overflowed (exp(x) is inf past x = 709 in float64, and inf / inf is nan): write the function so that "
    "it exponentiates only what cannot overflow (torch.tanh, torch.sigmoid, or exp(-|x|) with the sign put "
    "back; for a softmax, subtract the row's max first)",
)
# families: one entry each in the catalogue; the checker builds each case from the exercise's own formulas
# (learn/checker/families.py), and names it only when it fits every configuration
SAVED_FAMILY = Mistake(
    "wrong-saved-tensor",
    "its right formula with one saved tensor where another of the same shape belongs",
    "the two have the same shape, so nothing fails: check which tensor the formula needs",
)
AXIS_FAMILY = Mistake(
    "wrong-axis",
    "its right formula with a sum over another axis",
    "sum over the axis the forward's statistic (or broadcast) ran along; where the wrong sum still has a shape "
    "that fits (broadcasting lets a (1, D) stand where an (N, 1) belongs), nothing fails to tell you",
)
GENERIC = [
    OVERWRITE,
    DOUBLED,
    GRAD_NONE,
    DOUT_IN_PLACE,
    INPUT_IN_PLACE,
    CACHE_CHANGED,
    OVERFLOW,
    SAVED_FAMILY,
    AXIS_FAMILY,
]
