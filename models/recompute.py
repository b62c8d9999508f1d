"""The GPT's memory option: a Linear's input computed again in backward instead of held (llm.c's ``recompute``).

A Linear keeps its input for its weight gradient, dW = dout^T x.  In the GPT that input is the output of a
LayerNorm (before c_attn and c_fc) or of the GELU (before the MLP's c_proj), each of which keeps its own input
anyway; so instead of holding both, ``Recomputed(first, linear)`` holds only first's input, and its backward runs
first's forward again -- the same kernel on the same values, so the same bits -- to give the Linear its input
back.  One pass more per pair; one activation fewer held (the GELU's is the widest of a block, 4C).

    forward:   h = first(x);  y = linear(h)                     holds x (and the parameters h is made from)
    backward:  h = first(x) again
               dh = linear's backward(dy, h)                    dW, db added (in W, under the backward's split)
               dx = first's backward(dh)                        first's parameter gradients likewise

The two layers' own math runs (``forward_math``/``backward_math``, layers/template.py), so their formulas are
written once, in their files, and their kernels (kernels/) are used where on.  The pair holds neither layer's cache:
the layers themselves stay the plain ones, with nothing to set and nothing to give back.  ``models/gpt.py`` builds
one pair per LayerNorm -> Linear and GELU -> Linear when ``GPT.recompute`` is on.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from layers.composite import Composite
from layers.linear import Linear
from layers.template import add_grads


class Recomputed(Composite):
    """``linear(first(x))`` with first's output not held from forward to backward (the module docstring).

    ``first``: a layer whose output can be made again from its input (a LayerNorm, a GELU); ``linear``: the Linear
    it feeds.  Neither is a child here: the model that owns them names them (``ln_1``, ``attn.c_attn``), and this
    pair only runs their math.  The parameters the output is made from are version-checked as the pair's own: an
    in-place change between forward and backward (an optimizer step) would make the recomputed input differ from
    the forward's, and is refused."""

    _saved_labels = {"first_weight": "first's weight", "first_bias": "first's bias"}  # (x, weight: as they are)

    class Saved(NamedTuple):
        x: Tensor  # first's input, (*, D): its output is computed again from it
        first_weight: Tensor | None  # first's parameters (a LayerNorm's gamma and beta; None for a GELU)
        first_bias: Tensor | None
        weight: Tensor  # the Linear's, for dh

    def __init__(self, first, linear: Linear) -> None:
        self.first, self.linear = first, linear

    def named_children(self):  # (the owners name these layers; here they are what the pair runs)
        return iter((("first", self.first), ("linear", self.linear)))

    def extra_repr(self) -> str:
        return f"{self.first!r}, {self.linear!r}"

    def check_input(self, x, *args, **kwargs) -> None:
        self.first.check_input(x)

    def forward_math(self, x: Tensor):
        """x (*, D) -> linear(first(x)) (*, H); holds x, not first(x)."""
        h, _ = self.first.forward_math(x)  # (*, D); first's cache is made again in backward
        y, _ = self.linear.forward_math(h)  # (*, H); the Linear's input h is not held
        return y, self.Saved(
            x, getattr(self.first, "weight", None), getattr(self.first, "bias", None), self.linear.weight
        )

    def backward_math(self, dy: Tensor, saved: Saved) -> Tensor:
        """dy (*, H) -> dx (*, D); the Linear's and first's parameter gradients added (in W under the split)."""
        h, first_saved = self.first.forward_math(saved.x)  # first's output again, bit for bit the forward's
        lin = self.linear
        lin.needs_input_grad = True  # dh is first's dout
        dh, grads = lin.backward_math(dy, lin.Saved(h.reshape(-1, lin.in_features), saved.weight, h.shape[:-1]))
        self.later(add_grads, lin, grads)
        self.first.needs_input_grad = self.needs_input_grad
        result = self.first.backward_math(dh, first_saved)
        if not self.first._param_names:
            return result
        dx, grads = result
        self.later(add_grads, self.first, grads)
        return dx
