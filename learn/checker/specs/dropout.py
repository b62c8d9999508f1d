"""The checks of exercise dropout: Dropout(p=0.3, seed=7) on x (4, 6), and its known mistakes.

The masks come from the layer's own generator, seeded by the constructor, drawn as the exercise's given code
draws them (``torch.empty_like(x).bernoulli_(1 - p, generator=...)``, layers.Dropout's draw): the reference
replays the draws of each forward of one object, ``call`` counting them.  Central differences are no check
here (every forward draws a new mask).
"""

import torch

from ..spec import LayerSpec, normal, wrong


def _keep(c, call=None):
    """The keep mask (1 kept, 0 dropped) the object's forward number ``call`` draws."""
    gen = torch.Generator().manual_seed(c.seed)
    for _ in range((c.call if call is None else call) + 1):
        keep = torch.empty_like(c.x, dtype=torch.float64).bernoulli_(1 - c.p, generator=gen)
    return keep


def _mask(c):
    if c.p == 0:
        return torch.ones_like(c.x)
    return _keep(c) / (1 - c.p) if c.p < 1 else torch.zeros_like(c.x)


def _inputs(g, n=4, d=6):
    return {"x": normal(g, n, d)}


def _shaped(label, p, n=4, d=6, seed=7):
    return {"label": label, "ctor": {"p": p, "seed": seed}, "inputs": lambda g: _inputs(g, n, d)}


def _random(g):
    n, d = (int(v) for v in torch.randint(1, 8, (2,), generator=g))
    p = round(float(torch.rand((), generator=g)) * 0.9, 2)
    return _shaped(f"p = {p}, x ({n}, {d})", p, n, d, seed=int(torch.randint(0, 1000, (), generator=g)))


def _nonzero(c, t):
    return None if c.p in (0, 1) else t  # p = 0 and p = 1 give the same answer under these mistakes


SPEC = LayerSpec(
    name="dropout",
    cls="Dropout",
    ctor={"p": 0.3, "seed": 7},
    params={},
    inputs=_inputs,
    numeric=False,
    reference=lambda t: {"out": t.x * _mask(t)},
    context=lambda c: {"mask": _mask(c)},
    configs=[
        _shaped("p = 0: nothing dropped, out = x", 0.0),
        _shaped("p = 1: everything dropped, zeros", 1.0),
        _shaped("one example (N = 1), p = 0.75", 0.75, 1, 9),
        _shaped("p = 0.5, another seed", 0.5, 3, 4, 123),
    ],
    random=_random,
    formula=lambda c: {"dx": c.dout * c.mask},
    saved={"x": "the input", "out": "the output", "mask": "the mask, keep / (1 - p)"},
    nan_hint="with p = 1 every element is dropped and 1 / (1 - p) is 1/0 (0/0 = nan): the mask is zeros then",
    mistakes=[
        wrong(
            "dropout-not-scaled",
            "out",
            "x * keep, the kept elements not scaled",
            "inverted dropout scales the kept elements by 1 / (1 - p), so that out's expected value is x and the "
            "layer can be the identity at test time",
            lambda c: _nonzero(c, c.x * _keep(c)),
        ),
        wrong(
            "dropout-scaled-by-keep",
            "out",
            "x * keep * (1 - p), multiplied where it divides",
            "the kept elements are scaled up, by 1 / (1 - p): each survives with probability 1 - p, so its "
            "expected value is then x",
            lambda c: _nonzero(c, c.x * _keep(c) * (1 - c.p)),
        ),
        wrong(
            "dropout-p-as-keep",
            "out",
            "x * keep / p, p taken as the probability of keeping",
            "torch's p is the probability of dropping (CS231n's is of keeping): scale by 1 / (1 - p)",
            lambda c: _nonzero(c, c.x * _keep(c) / c.p),
        ),
        wrong(
            "dropout-backward-unscaled",
            "dx",
            "dout * keep, the mask without its 1 / (1 - p)",
            "out = x * mask with mask = keep / (1 - p): dx = dout * mask, the same scaled mask",
            lambda c: _nonzero(c, c.dout * _keep(c)),
        ),
        wrong(
            "dropout-backward-no-mask",
            "dx",
            "dout, as if nothing were dropped",
            "a dropped element did not reach the output: its gradient is 0, and a kept one's is scaled: dx = "
            "dout * mask, the forward's mask",
            lambda c: _nonzero(c, c.dout),
        ),
        wrong(
            "dropout-new-mask",
            "dx",
            "dout times a mask drawn anew in backward",
            "the mask is random: the backward must use the one the forward drew and applied (keep it in "
            "forward), never draw again",
            lambda c: _nonzero(c, c.dout * _keep(c, c.call + 1) / (1 - c.p)),
        ),
    ],
    where={"dx": "dx = dout * mask, the forward's own mask", "out": "out = x * keep / (1 - p)"},
)
