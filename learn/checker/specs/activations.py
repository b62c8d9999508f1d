"""The checks of exercises relu, sigmoid and tanh: an elementwise layer on x (3, 5), and its known mistakes."""

import torch

from ..spec import LayerSpec, normal, wrong


def _away_from_zero(g):
    x = normal(g, 3, 5, std=1.5)
    return {"x": x + 0.1 * torch.sign(x)}  # no entry near relu's kink, where central differences are wrong


def _zeros(g):
    """Exact zeros among the inputs, where autograd's relu'(0) = 0 (and sigmoid, tanh are smooth), and tiny values
    either side of 0, where the gradient is 1 or 0 as anywhere else."""
    x = normal(g, 4, 6, std=1.5)
    x[0, :3] = 0.0
    x[2, 4] = 0.0
    x[3, :2] = torch.tensor([1e-7, -1e-7], dtype=x.dtype)
    return {"x": x}


def _one_row(g):
    return {"x": normal(g, 1, 7, std=2.0)}


def _large(g):
    """Saturated: |x| from 20 to 800, both signs; past 709, exp(|x|) is inf in float64."""
    x = normal(g, 2, 5, std=15.0)
    x[1] = torch.tensor([800.0, -800.0, 710.0, -750.0, 300.0], dtype=x.dtype)
    return {"x": x}


CONFIGS = [
    {"label": "one example (N = 1)", "inputs": _one_row},
    {"label": "large inputs (|x| up to 800: exp(x) overflows past 709)", "inputs": _large, "numeric": False},
]


def _no_dout(name: str, local: str, fn):
    return wrong(
        f"{name}-no-dout",
        "dx",
        f"the local derivative {local} alone",
        f"the chain rule multiplies the local derivative by the gradient that arrives from above: dx = dout * {local}",
        fn,
    )


_INVERTED = (
    "the mask is taken from the wrong side: the gradient passes where x > 0 (there out = x, a slope of 1) "
    "and stops where x <= 0 (there out = 0, a constant)"
)

_SAVED = {"x": "the input", "out": "the output"}

RELU = LayerSpec(
    name="relu",
    cls="ReLU",
    ctor={},
    params={},
    inputs=_away_from_zero,
    saved=_SAVED,
    formula=lambda c: {"dx": c.dout * (c.x > 0)},
    reference=lambda t: {"out": torch.relu(t.x)},
    configs=[
        CONFIGS[0],
        {
            "label": "exact zeros in x (relu's gradient there is 0), and tiny values (1e-7)",
            "inputs": _zeros,
            "numeric": False,
        },
    ],
    mistakes=[
        wrong("relu-mask-inverted", "dx", "dout * (x < 0)", _INVERTED, lambda c: c.dout * (c.x < 0)),
        wrong(
            "relu-mask-inverted",
            "dx",
            "dout * ~mask, that is dout * (x <= 0)",
            _INVERTED,
            lambda c: c.dout * (c.x <= 0),
        ),
        wrong(
            "relu-mask-from-dout",
            "dx",
            "dout * (dout > 0)",
            "the mask must come from the forward's input (x > 0), not from the sign of the gradient: a negative "
            "gradient flows through a ReLU that was on",
            lambda c: c.dout * (c.dout > 0),
        ),
        wrong(
            "relu-times-x",
            "dx",
            "dout * x",
            "the local derivative of max(x, 0) is 1 where x > 0 and 0 elsewhere, not x",
            lambda c: c.dout * c.x,
        ),
        wrong(
            "relu-times-out",
            "dx",
            "dout * out",
            "the local derivative of max(x, 0) is 1 where x > 0 and 0 elsewhere, not the output",
            lambda c: c.dout * c.out,
        ),
        _no_dout("relu", "(x > 0)", lambda c: (c.x > 0).double()),
    ],
    where={"dx": "dx = dout * (x > 0)", "out": "out = max(x, 0), a new tensor"},
)

_OVERFLOW = (
    "an exp overflowed: exp(x) is inf past x = 709, and inf / inf is nan.  Exponentiate only -|x| (or use "
    "torch.sigmoid, torch.tanh), which cannot overflow"
)

SIGMOID = LayerSpec(
    name="sigmoid",
    cls="Sigmoid",
    ctor={},
    params={},
    inputs=_away_from_zero,
    nan_hint=_OVERFLOW,
    saved=_SAVED,
    formula=lambda c: {"dx": c.dout * c.out * (1 - c.out)},
    reference=lambda t: {"out": torch.sigmoid(t.x)},
    configs=CONFIGS,
    mistakes=[
        wrong(
            "sigmoid-no-one-minus",
            "dx",
            "dout * s",
            "the derivative of s = sigmoid(x) is s * (1 - s): the (1 - s) is missing",
            lambda c: c.dout * c.out,
        ),
        wrong(
            "sigmoid-of-input",
            "dx",
            "dout * x * (1 - x)",
            "s * (1 - s) is written with the output s = sigmoid(x), not with the input x",
            lambda c: c.dout * c.x * (1 - c.x),
        ),
        wrong(
            "sigmoid-applied-twice",
            "dx",
            "dout * sigmoid(s) * (1 - sigmoid(s))",
            "the saved output is already s = sigmoid(x): use it as it is, s * (1 - s)",
            lambda c: c.dout * torch.sigmoid(c.out) * (1 - torch.sigmoid(c.out)),
        ),
        _no_dout("sigmoid", "s * (1 - s)", lambda c: c.out * (1 - c.out)),
    ],
    where={"dx": "dx = dout * s * (1 - s), with s the saved output"},
)

TANH = LayerSpec(
    name="tanh",
    cls="Tanh",
    ctor={},
    params={},
    inputs=_away_from_zero,
    nan_hint=_OVERFLOW,
    saved=_SAVED,
    formula=lambda c: {"dx": c.dout * (1 - c.out**2)},
    reference=lambda t: {"out": torch.tanh(t.x)},
    configs=CONFIGS,
    mistakes=[
        wrong(
            "tanh-of-input",
            "dx",
            "dout * (1 - x**2)",
            "tanh's derivative is 1 - tanh(x)**2: it is written with the output t = tanh(x), not the input x",
            lambda c: c.dout * (1 - c.x**2),
        ),
        wrong(
            "tanh-applied-twice",
            "dx",
            "dout * (1 - tanh(out)**2)",
            "the saved output is already t = tanh(x): the derivative is 1 - t**2, without a second tanh",
            lambda c: c.dout * (1 - torch.tanh(c.out) ** 2),
        ),
        wrong(
            "tanh-no-square",
            "dx",
            "dout * (1 - out)",
            "the derivative of tanh is 1 - out**2: the square is missing",
            lambda c: c.dout * (1 - c.out),
        ),
        _no_dout("tanh", "(1 - out**2)", lambda c: 1 - c.out**2),
    ],
    where={"dx": "dx = dout * (1 - t**2), with t the saved output"},
)
