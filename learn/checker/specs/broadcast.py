"""The checks of exercise broadcast: ScaleShift on x (4, 3, 5), scale (3, 1), shift (5,), other broadcasts, and its
known mistakes (each replays a wrong way back from out's shape to an input's)."""

import torch

from ..families import reduce_of
from ..spec import LayerSpec, normal


def sum_to(g, shape, r=None, how="right"):
    """g summed back to ``shape``: "right"; "mean" (means instead of sums); "leading" (only the axes broadcasting
    added in front); "ones" (only the axes where shape has size 1, the leading ones left); "none" (g as it is)."""

    def total(t, axis, keepdim=False):
        if how == "mean":
            return t.mean(axis, keepdim=keepdim)
        return r.sum(t, axis, keepdim=keepdim, label="the broadcast gradient") if r else t.sum(axis, keepdim=keepdim)

    if how == "none":
        return g
    lead = g.dim() - len(shape)
    if how != "ones":
        for _ in range(lead):
            g = total(g, 0)
        lead = 0
    if how == "leading":
        return g
    for axis, n in enumerate(shape):
        if n == 1 and g.shape[axis + lead] != 1:
            g = total(g, axis + lead, keepdim=True)
    return g


def _sum_to_no_keepdim(g, shape):
    """The sum over the broadcast axes with the size-1 axes dropped (keepdim forgotten)."""
    lead = g.dim() - len(shape)
    out = g.sum(tuple(range(lead))) if lead else g
    axes = tuple(a for a, n in enumerate(shape) if n == 1 and out.shape[a] != 1)
    return out.sum(axes) if axes else out


def _formula(c):
    """The right backward from the named tensors (families.py replays it)."""
    r = reduce_of(c)
    return {
        "dx": sum_to(c.dout * c.scale, c.x.shape, r),
        "dscale": sum_to(c.dout * c.x, c.scale.shape, r),
        "dshift": sum_to(c.dout, c.shift.shape, r),
    }


def _each(how):
    """Every gradient summed back the wrong way ``how``."""

    def value(c):
        if how == "no-keepdim":
            return {
                "dx": _sum_to_no_keepdim(c.dout * c.scale, c.x.shape),
                "dscale": _sum_to_no_keepdim(c.dout * c.x, c.scale.shape),
                "dshift": _sum_to_no_keepdim(c.dout, c.shift.shape),
            }
        return {
            "dx": sum_to(c.dout * c.scale, c.x.shape, how=how),
            "dscale": sum_to(c.dout * c.x, c.scale.shape, how=how),
            "dshift": sum_to(c.dout, c.shift.shape, how=how),
        }

    return value


def _draw(g, shape, mean=0.0):
    return torch.randn(tuple(shape), generator=g, dtype=torch.float64) + mean  # a 0-d shape too


def _shapes(label, x, scale, shift):
    return {
        "label": label,
        "inputs": lambda g: {"x": _draw(g, x), "scale": _draw(g, scale, 0.5), "shift": _draw(g, shift)},
    }


def _random(g):
    out = [int(v) for v in torch.randint(1, 5, (3,), generator=g)]
    shapes = []
    for k in range(3):  # each input: some axes kept, some set to 1, the leading ones perhaps dropped
        keep = torch.rand(3, generator=g) < 0.5
        s = [n if bool(k_) else 1 for n, k_ in zip(out, keep, strict=True)]
        drop = int(torch.randint(0, 3, (), generator=g)) if k else 0  # x keeps every axis: out's shape is x's
        shapes.append(tuple(s[drop:]) if k else tuple(out))
    x, scale, shift = shapes
    return _shapes(f"x {x}, scale {scale}, shift {shift}", x, scale, shift)


def _mistake(key, formula, why, how):
    from ...mistakes import Mistake

    return Mistake(key, formula, why, _each(how))


SPEC = LayerSpec(
    name="broadcast",
    cls="ScaleShift",
    ctor={},
    params={},
    inputs=lambda g: {"x": normal(g, 4, 3, 5), "scale": normal(g, 3, 1, mean=0.5), "shift": normal(g, 5)},
    reference=lambda t: {"out": t.x * t.scale + t.shift},
    returns=("dx", "dscale", "dshift"),
    configs=[
        _shapes("x broadcast too: x (2, 1, 4), scale (3, 1), shift (1, 4)", (2, 1, 4), (3, 1), (1, 4)),
        _shapes("a scalar scale (), shift (1,)", (3, 4), (), (1,)),
        _shapes("no broadcasting: all (3, 4)", (3, 4), (3, 4), (3, 4)),
        _shapes("a leading 1: scale (1, 3, 1), shift (4, 1, 1)", (4, 3, 5), (1, 3, 1), (4, 1, 1)),
    ],
    random=_random,
    formula=_formula,
    saved={"x": "the input x", "scale": "the scale", "shift": "the shift", "out": "the output"},
    mistakes=[
        _mistake(
            "broadcast-not-summed",
            "out's shape: the gradient not summed back",
            "each input's gradient has that input's shape: sum the broadcast gradient over every axis "
            "broadcasting stretched",
            "none",
        ),
        _mistake(
            "broadcast-mean",
            "the broadcast axes averaged, not summed",
            "a broadcast copies the input to every place along the axis, and each copy's gradient counts: sum "
            "them (a mean is the gradient of a broadcast that divided by the count)",
            "mean",
        ),
        _mistake(
            "broadcast-leading-only",
            "summed over the leading axes only, the size-1 axes left stretched",
            "an axis where the input has size 1 is stretched too: sum over it with keepdim=True",
            "leading",
        ),
        _mistake(
            "broadcast-ones-only",
            "summed over the size-1 axes only, the leading axes left",
            "the axes broadcasting added in front (the input has fewer dimensions) are summed away too",
            "ones",
        ),
        _mistake(
            "broadcast-no-keepdim",
            "summed without keepdim: the size-1 axes dropped",
            "sum over an axis where the input has size 1 with keepdim=True, so that the 1 stays and the "
            "gradient has the input's shape",
            "no-keepdim",
        ),
    ],
    where={
        "dx": "dx = sum_to(dout * scale, x.shape)",
        "dscale": "dscale = sum_to(dout * x, scale.shape)",
        "dshift": "dshift = sum_to(dout, shift.shape)",
    },
)
