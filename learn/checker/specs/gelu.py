"""The checks of exercise gelu: GELU, exact and tanh-approximated, on x (3, 5), and its known mistakes."""

import math

import torch
import torch.nn.functional as F

from ..spec import LayerSpec, normal, wrong

_C = math.sqrt(2 / math.pi)


def _phi(x):
    return torch.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)


def _cdf(x):
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


def _t(x):
    return torch.tanh(_C * (x + 0.044715 * x**3))


def _dx(c, pdf_scale=1.0, second_term=True, inner=True, three=True):
    """dx under the given mistakes (none by default), for the configuration's approximate."""
    x = c.x
    if c.approximate == "tanh":
        t = _t(x)
        du = _C * (1 + (3 if three else 1) * 0.044715 * x**2) if inner else 1.0
        return c.dout * (0.5 * (1 + t) + (0.5 * x * (1 - t**2) * du if second_term else 0))
    return c.dout * (_cdf(x) + (x * _phi(x) * pdf_scale if second_term else 0))


def _inputs(g, n=3, d=5, std=1.5):
    return {"x": normal(g, n, d, std=std)}


def _large(g):
    x = normal(g, 2, 5, std=15.0)
    x[1] = torch.tensor([800.0, -800.0, 710.0, -750.0, 40.0], dtype=x.dtype)
    return {"x": x}


def _random(g):
    n, d = (int(v) for v in torch.randint(1, 7, (2,), generator=g))
    return {"label": f"x ({n}, {d})", "inputs": lambda g2: _inputs(g2, n, d)}


def _exact(c, t):
    return t if c.approximate != "tanh" else None  # a slip of the exact form's branch: the tanh form untouched


def _tanh(c, t):
    return t if c.approximate == "tanh" else None


_TANH = {"approximate": "tanh"}
SPEC = LayerSpec(
    name="gelu",
    cls="GELU",
    ctor={"approximate": "none"},
    params={},
    inputs=_inputs,
    reference=lambda t: {"out": F.gelu(t.x, approximate=t.approximate)},
    configs=[
        {"label": "approximate='tanh'", "ctor": _TANH},
        {"label": "large inputs (|x| up to 800: exp overflows past 709)", "inputs": _large, "numeric": False},
        {
            "label": "approximate='tanh', large inputs (|x| up to 800)",
            "ctor": _TANH,
            "inputs": _large,
            "numeric": False,
        },
        {"label": "one example (N = 1)", "inputs": lambda g: _inputs(g, 1, 7)},
    ],
    random=_random,
    formula=lambda c: {"dx": _dx(c)},
    saved={"x": "the input", "out": "the output"},
    nan_hint=(
        "an exp or a cube overflowed: exp(x^2 / 2) is inf past |x| = 38, exp(x) past 709; write phi as "
        "exp(-x^2 / 2), which only underflows to 0, and use torch.tanh and torch.erf"
    ),
    mistakes=[
        wrong(
            "gelu-product-rule-half",
            "dx",
            "dout * Phi(x), without x phi(x)",
            "out = x * Phi(x) is a product: d out/dx = Phi(x) + x phi(x), the second term from Phi's own derivative",
            lambda c: _exact(c, _dx(c, second_term=False)),
        ),
        wrong(
            "gelu-product-rule-half",
            "dx",
            "dout * (1 + t) / 2, without x/2 times dt/dx",
            "out = x/2 (1 + t) is a product: its derivative is (1 + t)/2 + x/2 (1 - t^2) du/dx",
            lambda c: _tanh(c, _dx(c, second_term=False)),
        ),
        wrong(
            "gelu-pdf-unnormalised",
            "dx",
            "dout * (Phi(x) + x exp(-x^2/2)), without 1/sqrt(2 pi)",
            "phi is the standard normal density: exp(-x^2 / 2) / sqrt(2 pi)",
            lambda c: _dx(c, pdf_scale=math.sqrt(2 * math.pi)),
        ),
        wrong(
            "gelu-erf-no-sqrt2",
            "out",
            "x (1 + erf(x)) / 2, erf of x instead of x / sqrt(2)",
            "Phi(x) = (1 + erf(x / sqrt(2))) / 2: erf is the CDF of a normal of variance 1/2, hence the sqrt(2)",
            lambda c: _exact(c, 0.5 * c.x * (1 + torch.erf(c.x))),
        ),
        wrong(
            "gelu-approximate-ignored",
            "out",
            "the exact GELU where approximate='tanh' asks for the tanh form",
            "the two differ by up to about 1e-3: with approximate='tanh', out = x/2 (1 + tanh(sqrt(2/pi) (x + "
            "0.044715 x^3)))",
            lambda c: F.gelu(c.x) if c.approximate == "tanh" else None,
        ),
        wrong(
            "gelu-tanh-chain-dropped",
            "dx",
            "the tanh form's derivative without du/dx",
            "tanh(u) is a function of u = sqrt(2/pi) (x + 0.044715 x^3): its derivative (1 - t^2) is multiplied "
            "by du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)",
            lambda c: _dx(c, inner=False),
        ),
        wrong(
            "gelu-tanh-cube-no-three",
            "dx",
            "du/dx = sqrt(2/pi) (1 + 0.044715 x^2), the 3 of x^3 lost",
            "the derivative of x^3 is 3 x^2: du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)",
            lambda c: _dx(c, three=False),
        ),
    ],
    where={
        "dx": "dx = dout * (Phi(x) + x phi(x)); tanh form: dout * (0.5 (1 + t) + 0.5 x (1 - t^2) du/dx)",
        "out": "out = x Phi(x), Phi(x) = (1 + erf(x / sqrt(2))) / 2",
    },
)
