"""The step-through page's predict mode: the wrong answers a guess may match, each named as the mistake it is.

For each backward step the page asks for the first entry of the gradient it reveals.  ``wrong_answers`` lists,
for that entry, what the usual mistakes would give (computed from the walk's own tensors) and the words that
name each: a guess that matches one is told which ("that is dL/dy itself: the local derivative y(1 − y) is
missing"), the catalogue's idea (``learn/mistakes.py``) brought to the page.  A mistake whose number is
indistinguishable from the right answer at the page's 3 significant digits is left out.
"""

from __future__ import annotations

import torch

N = 4  # examples


def _distinct(right: float, candidates: list[tuple[float, str]]) -> list[dict]:
    """The candidates that a 3-digit guess can tell from the right answer and from each other."""

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= 2e-3 * max(abs(a), abs(b), 1e-12)

    out = []
    for value, says in candidates:
        if not close(value, right) and not any(close(value, o["value"]) for o in out):
            out.append({"value": value, "says": says})
    return out


def wrong_answers(v: dict[str, torch.Tensor], g: dict[str, torch.Tensor]) -> dict[str, list[dict]]:
    """{gradient's tensor: [{"value", "says"}]} for the entry each backward step asks: v the values, g the
    gradients (by the page's tensor names)."""
    v, g = ({k: t.detach() for k, t in d.items()} for d in (v, g))  # numbers: a parameter's tensor requires grad
    y, t, h, x, z1, z2 = v["y"], v["t"], v["h"], v["x"], v["z1"], v["z2"]
    dy, dz2, dh, dz1 = g["y"], g["z2"], g["h"], g["z1"]
    f = float
    cases = {
        "loss": (
            1.0,
            [
                (f(v["loss"]), "that is the loss itself: its gradient with respect to itself is 1"),
                (0.0, "the loss does change with itself, at rate 1: dL/dL = 1"),
            ],
        ),
        "y": (
            f(dy[0, 0]),
            [
                (
                    f(2 * (y - t)[0, 0]),
                    "that is 2(y − t) without the 1/4: the mean over the four examples divides every term by 4",
                ),
                (f((y - t)[0, 0] / N), "the 2 of the square is missing: d(y − t)²/dy = 2(y − t)"),
                (f(2 * (t - y)[0, 0] / N), "the sign is flipped: d(y − t)²/dy = 2(y − t), not 2(t − y)"),
                (f((y - t)[0, 0] ** 2 / N), "that is the example's share of the loss, not its derivative"),
            ],
        ),
        "z2": (
            f(dz2[0, 0]),
            [
                (f(dy[0, 0]), "that is dL/dy itself: the local derivative y(1 − y) is missing"),
                (
                    f(y[0, 0] * (1 - y[0, 0])),
                    "that is the local derivative y(1 − y) alone: multiply it by the downstream gradient dL/dy",
                ),
                (
                    f(dy[0, 0] * z2[0, 0] * (1 - z2[0, 0])),
                    "the local derivative was written with the input z2: the sigmoid's is y(1 − y), with y its output",
                ),
                (f(dy[0, 0] * y[0, 0]), "the (1 − y) of the local derivative y(1 − y) is missing"),
            ],
        ),
        "W2": (
            f((dz2[:, 0] * h[:, 0]).sum()),
            [
                (
                    f((dz2[:, 0] * h[:, 0]).mean()),
                    "that is the mean over the examples: W2 serves all four, so their "
                    "contributions add up (the 1/4 is already inside dL/dy)",
                ),
                (f(dz2[0, 0] * h[0, 0]), "that is the first example's contribution alone: add all four examples'"),
                (f((dz2[:, 0] * h[:, 1]).sum()), "that pairs dL/dz2 with h's other column: W2[0,j] multiplies h[n,j]"),
                (
                    f((dy[:, 0] * h[:, 0]).sum()),
                    "that uses dL/dy where dL/dz2 belongs: the gradient must pass the sigmoid first",
                ),
            ],
        ),
        "b2": (
            f(dz2.sum()),
            [
                (
                    f(dz2.mean()),
                    "that is the mean over the examples: b2 is added to all four, so their gradients add up",
                ),
                (f(dz2[0, 0]), "that is the first example's alone: add all four examples'"),
                (f(dy.sum()), "that uses dL/dy where dL/dz2 belongs: the gradient must pass the sigmoid first"),
            ],
        ),
        "h": (
            f(dh[0, 0]),
            [
                (f(dz2[0, 0] * v["W2"][0, 1]), "that is the other weight: h[n,j] is multiplied by W2[0,j]"),
                (f(dz2[0, 0]), "that is dL/dz2 itself: the local derivative, the weight W2[0,0], is missing"),
                (
                    f(dy[0, 0] * v["W2"][0, 0]),
                    "that uses dL/dy where dL/dz2 belongs: the gradient must pass the sigmoid first",
                ),
            ],
        ),
        "z1": (
            f(dz1[0, 0]),
            [
                (f(dh[0, 0]), "that is dL/dh itself: the local derivative 1 − h² is missing"),
                (
                    f(dh[0, 0] * (1 - z1[0, 0] ** 2)),
                    "the local derivative was written with the input z1: tanh's is 1 − h², with h its output",
                ),
                (f(dh[0, 0] * (1 - h[0, 0])), "the square is missing: tanh's derivative is 1 − h²"),
                (
                    f(1 - h[0, 0] ** 2),
                    "that is the local derivative 1 − h² alone: multiply it by the downstream gradient dL/dh",
                ),
            ],
        ),
        "W1": (
            f((dz1[:, 0] * x[:, 0]).sum()),
            [
                (
                    f((dz1[:, 0] * x[:, 0]).mean()),
                    "that is the mean over the examples: W1 serves all four, so their contributions add up",
                ),
                (f((dz1[:, 0] * x[:, 1]).sum()), "that pairs dL/dz1 with x's other column: W1[i,j] multiplies x[n,j]"),
                (
                    f((dh[:, 0] * x[:, 0]).sum()),
                    "that uses dL/dh where dL/dz1 belongs: the gradient must pass the tanh first",
                ),
            ],
        ),
        "b1": (
            f(dz1[:, 0].sum()),
            [
                (
                    f(dz1[:, 0].mean()),
                    "that is the mean over the examples: b1 is added to all four, so their gradients add up",
                ),
                (f(dz1[0, 0]), "that is the first example's alone: add all four examples'"),
                (f(dh[:, 0].sum()), "that uses dL/dh where dL/dz1 belongs: the gradient must pass the tanh first"),
            ],
        ),
    }
    return {name: _distinct(right, candidates) for name, (right, candidates) in cases.items()}
