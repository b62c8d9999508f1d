"""The checks of exercise linear: Linear(5, 3) on x (4, 5), and its known mistakes."""

import torch

from ..families import reduce_of
from ..spec import LayerSpec, normal, uniform, wrong

MISTAKES = [
    wrong(
        "bias-mean",
        "bias.grad",
        "dout.mean(0)",
        "the bias is added to every row, so its gradient is the *sum* over the batch: dout.sum(0)",
        lambda c: c.dout.mean(0),
    ),
    wrong(
        "bias-not-summed",
        "bias.grad",
        "dout, of shape (N, H)",
        "bias (H,) is added to every one of the N rows of the batch, so its gradient sums dout over the batch: "
        "dout.sum(0), of shape (H,)",
        lambda c: c.dout,
    ),
    wrong(
        "weight-transposed",
        "weight.grad",
        "x.T @ dout, of shape (in_features, out_features)",
        "that is the gradient of a (D, H) W used as x @ W (CS231n's layout).  Here weight is (out_features, "
        "in_features) as nn.Linear stores it and out = x @ weight.T, so dweight = dout.T @ x, the shape of weight",
        lambda c: c.x.T @ c.dout,
    ),
    wrong(
        "weight-mean",
        "weight.grad",
        "dout.T @ x / N",
        "no 1/N here: the weight's gradient is the sum over the batch of each example's share (a mean belongs to "
        "the loss, which already put its 1/N into dout)",
        lambda c: c.dout.T @ c.x / len(c.x),
    ),
]


def _formula(c) -> dict:
    """The right backward, from the named tensors (families.py replays it)."""
    return {
        "dx": c.dout @ c.weight,
        "weight.grad": c.dout.T @ c.x,
        "bias.grad": reduce_of(c).sum(c.dout, 0, label="dout"),
    }


SAVED = {"x": "the input", "out": "the output", "weight": "the weight"}


def _shapes(label: str, n: int, d: int, h: int) -> dict:
    """A configuration: x (n, d), Linear(d, h)."""
    return {
        "label": label,
        "ctor": {"in_features": d, "out_features": h},
        "params": {"weight": lambda g: uniform(g, h, d), "bias": lambda g: normal(g, h, mean=0.5)},
        "inputs": lambda g: {"x": normal(g, n, d)},
    }


def _random(g: torch.Generator) -> dict:
    n, d, h = (int(v) for v in torch.randint(1, 8, (3,), generator=g))
    return _shapes(f"N = {n}, D = {d}, H = {h}", n, d, h)


SPEC = LayerSpec(
    name="linear",
    cls="Linear",
    ctor={"in_features": 5, "out_features": 3},
    params={"weight": lambda g: uniform(g, 3, 5), "bias": lambda g: normal(g, 3, mean=0.5)},
    inputs=lambda g: {"x": normal(g, 4, 5)},
    reference=lambda t: {"out": t.x @ t.weight.T + t.bias},
    mistakes=MISTAKES,
    formula=_formula,
    saved=SAVED,
    configs=[_shapes("one example (N = 1)", 1, 5, 3), _shapes("wide: N = 3, D = 2, H = 6", 3, 2, 6)],
    random=_random,
    where={
        "dx": "dx = dout @ weight: (N, H) @ (H, D)",
        "weight.grad": "dweight = dout.T @ x, (H, N) @ (N, D): a sum over the batch",
        "bias.grad": "dbias = dout.sum(0)",
        "out": "out = x @ weight.T + bias",
    },
)
