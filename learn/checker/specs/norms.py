"""The checks of exercises batchnorm and layernorm, and their known mistakes.

One feature (batch norm) or one row (layer norm) varies very little, its variance near eps = 1e-5: there a
missing eps, or an eps in the wrong place, changes the output well beyond round-off.
"""

import torch

from ..families import reduce_of
from ..spec import LayerSpec, normal, uniform, wrong

EPS = 1e-5


def _stats(x, dim, unbiased=False):
    mean = x.mean(dim, keepdim=True)
    var = x.var(dim, keepdim=True, correction=1 if unbiased else 0)
    return mean, var


def _norm(t, dim, unbiased=False, eps_outside=False, eps=EPS):
    mean, var = _stats(t.x, dim, unbiased)
    scale = var.sqrt() + eps if eps_outside else (var + eps).sqrt()
    return t.weight * (t.x - mean) / scale + t.bias


def _context(dim):
    def ctx(c):
        mean, var = _stats(c.x, dim)
        rstd = 1 / (var + EPS).sqrt()
        xhat = (c.x - mean) * rstd
        return {"rstd": rstd, "xhat": xhat, "dxhat": c.dout * c.weight}

    return ctx


def _formula(dim):
    """The right backward from the named tensors (families.py replays it): dim is the statistics' axis."""

    def formula(c):
        r, keep, n = reduce_of(c), dim != 0, c.x.shape[dim]
        dxhat = c.dout * c.weight  # (N, D)
        s1 = r.sum(dxhat, dim, keepdim=keep, label="dxhat")
        s2 = r.sum(dxhat * c.xhat, dim, keepdim=keep, label="dxhat * xhat")
        return {
            "dx": c.rstd / n * (n * dxhat - s1 - c.xhat * s2),
            "weight.grad": r.sum(c.dout * c.xhat, 0, label="dout * xhat"),
            "bias.grad": r.sum(c.dout, 0, label="dout"),
        }

    return formula


SAVED = {
    "x": "the input",
    "xhat": "the normalised input (x - mean) * rstd",
    "out": "the output, weight * xhat + bias",
    "weight": "the scale gamma",
    "bias": "the shift beta",
    "rstd": "1 / sqrt(var + eps)",
}


def _without(c, dim, mean_path: bool, var_path: bool):
    """dx when the mean's and/or the variance's dependence on x is dropped (treated as constants)."""
    dx = c.dxhat
    if mean_path:
        dx = dx - c.dxhat.mean(dim, keepdim=True)
    if var_path:
        dx = dx - c.xhat * (c.dxhat * c.xhat).mean(dim, keepdim=True)
    return c.rstd * dx


def _count(c, dim, m):
    """dx with the count m of the wrong axis (D for N, or N for D) in the formula's 1/m and m * dxhat."""
    keep = dim != 0
    s1 = c.dxhat.sum(dim, keepdim=keep)
    s2 = (c.dxhat * c.xhat).sum(dim, keepdim=keep)
    return c.rstd / m * (m * c.dxhat - s1 - c.xhat * s2)


def _unbiased(axis: str):
    return (
        "the variance divided by N - 1 (x.var() is unbiased by default)",
        f"PyTorch normalises with the biased variance, divided by the {axis}: x.var(unbiased=False), or "
        f"((x - mean)**2).mean()",
    )


def _bn_inputs(g):
    x = normal(g, 6, 4, std=2.0, mean=0.5)
    x[:, 3] *= 2e-3  # a feature whose variance is near eps
    return {"x": x}


def _norm_config(label: str, n: int, d: int, ctor_name: str, inputs) -> dict:
    return {
        "label": label,
        "ctor": {ctor_name: d},
        "params": {"weight": lambda g: uniform(g, d, lo=0.5, hi=1.5), "bias": lambda g: normal(g, d, mean=0.3)},
        "inputs": lambda g: inputs(g, n, d),
    }


def _bn_shaped(g, n, d):
    x = normal(g, n, d, std=2.0, mean=0.5)
    if n > 1 and d > 1:
        x[:, -1] *= 2e-3
    return {"x": x}


def _bn_random(g):
    n, d = int(torch.randint(2, 9, (), generator=g)), int(torch.randint(1, 7, (), generator=g))
    return _norm_config(f"N = {n}, D = {d}", n, d, "num_features", _bn_shaped)


_CONSTANTS = (
    "mean and var treated as constants: dout * weight / sqrt(var + eps)",
    "the mean and the variance are computed from x, so every x of the {axis} also moves the output through "
    "them: dx = rstd / {n} * ({n} * dxhat - dxhat.sum({d}) - xhat * (dxhat * xhat).sum({d})), dxhat = dout "
    "* weight",
)

BATCHNORM = LayerSpec(
    name="batchnorm",
    cls="BatchNorm1d",
    ctor={"num_features": 4},
    params={"weight": lambda g: uniform(g, 4, lo=0.5, hi=1.5), "bias": lambda g: normal(g, 4, mean=0.3)},
    inputs=_bn_inputs,
    reference=lambda t: {"out": _norm(t, 0)},
    context=_context(0),
    formula=_formula(0),
    saved=SAVED,
    configs=[
        _norm_config("a small odd batch (N = 3, D = 5)", 3, 5, "num_features", _bn_shaped),
        _norm_config("two examples (N = 2, D = 3)", 2, 3, "num_features", _bn_shaped),
        _norm_config("square (N = D = 4)", 4, 4, "num_features", _bn_shaped),
    ],
    random=_bn_random,
    mistakes=[
        wrong(
            "bn-stats-constant",
            "dx",
            _CONSTANTS[0],
            _CONSTANTS[1].format(axis="column", n="N", d=0),
            lambda c: c.dxhat * c.rstd,
        ),
        wrong(
            "bn-var-constant",
            "dx",
            "the mean's term without the variance's: rstd * (dxhat - dxhat.mean(0))",
            "the variance depends on x too: its term is - xhat * (dxhat * xhat).mean(0), inside the rstd * (...)",
            lambda c: _without(c, 0, True, False),
        ),
        wrong(
            "bn-mean-constant",
            "dx",
            "the variance's term without the mean's",
            "the mean depends on x too: its term is - dxhat.mean(0), inside the rstd * (...)",
            lambda c: _without(c, 0, False, True),
        ),
        wrong(
            "bn-count-features",
            "dx",
            "the formula with n = D, the number of features, where N belongs",
            "batch norm's statistics average over the batch: n = dout.shape[0], the number of examples N",
            lambda c: _count(c, 0, c.x.shape[1]),
        ),
        wrong("bn-unbiased-var", "out", *_unbiased("batch size N"), lambda c: _norm(c, 0, unbiased=True)),
        wrong(
            "bn-eps-outside-sqrt",
            "out",
            "(x - mean) / (sqrt(var) + eps)",
            "eps goes inside the square root: (x - mean) / sqrt(var + eps), as PyTorch computes it (it matters "
            "for a feature whose variance is small)",
            lambda c: _norm(c, 0, eps_outside=True),
        ),
        wrong(
            "bn-no-eps",
            "out",
            "(x - mean) / sqrt(var)",
            "eps is missing: (x - mean) / sqrt(var + eps), eps = 1e-5 (it matters for a feature whose variance "
            "is small)",
            lambda c: _norm(c, 0, eps=0.0),
        ),
        wrong(
            "bn-dweight-with-x",
            "weight.grad",
            "(dout * x).sum(0)",
            "weight multiplies xhat, the normalised x: (dout * xhat).sum(0)",
            lambda c: (c.dout * c.x).sum(0),
        ),
        wrong(
            "bn-dweight-is-dbias",
            "weight.grad",
            "dout.sum(0)",
            "that is bias's gradient; weight multiplies xhat: (dout * xhat).sum(0)",
            lambda c: c.dout.sum(0),
        ),
        wrong(
            "bn-dbias-mean",
            "bias.grad",
            "dout.mean(0)",
            "bias is added to every row, so its gradient is the *sum* over the batch: dout.sum(0)",
            lambda c: c.dout.mean(0),
        ),
    ],
    where={
        "dx": "dx's three terms: directly, through the mean, through the variance",
        "weight.grad": "dweight = (dout * xhat).sum(0)",
        "bias.grad": "dbias = dout.sum(0)",
        "out": "mean, biased var, xhat = (x - mean) / sqrt(var + eps)",
    },
)


def _ln_inputs(g):
    x = normal(g, 3, 5, std=2.0, mean=0.5)
    x[2] = 0.7 + 2e-3 * x[2]  # a row whose variance is near eps
    return {"x": x}


def _ln_shaped(g, n, d):
    x = normal(g, n, d, std=2.0, mean=0.5)
    if n > 1:
        x[-1] = 0.7 + 2e-3 * x[-1]
    return {"x": x}


def _ln_random(g):
    n, d = int(torch.randint(1, 7, (), generator=g)), int(torch.randint(2, 9, (), generator=g))
    return _norm_config(f"N = {n}, D = {d}", n, d, "normalized_shape", _ln_shaped)


LAYERNORM = LayerSpec(
    name="layernorm",
    cls="LayerNorm",
    ctor={"normalized_shape": 5},
    params={"weight": lambda g: uniform(g, 5, lo=0.5, hi=1.5), "bias": lambda g: normal(g, 5, mean=0.3)},
    inputs=_ln_inputs,
    reference=lambda t: {"out": _norm(t, -1)},
    context=_context(-1),
    formula=_formula(-1),
    saved=SAVED,
    configs=[
        _norm_config("one example (N = 1, D = 6)", 1, 6, "normalized_shape", _ln_shaped),
        _norm_config("N = 4, D = 3", 4, 3, "normalized_shape", _ln_shaped),
        _norm_config("square (N = D = 4)", 4, 4, "normalized_shape", _ln_shaped),
    ],
    random=_ln_random,
    mistakes=[
        wrong(
            "ln-stats-constant",
            "dx",
            _CONSTANTS[0],
            _CONSTANTS[1].format(axis="row", n="D", d="1, keepdim=True"),
            lambda c: c.dxhat * c.rstd,
        ),
        wrong(
            "ln-mean-constant",
            "dx",
            "the variance's term without the mean's",
            "the row's mean depends on x too: its term is - dxhat.mean(1, keepdim=True), inside rstd * (...)",
            lambda c: _without(c, -1, False, True),
        ),
        wrong(
            "ln-var-constant",
            "dx",
            "the mean's term without the variance's",
            "the row's variance depends on x too: its term is - xhat * (dxhat * xhat).mean(1, keepdim=True)",
            lambda c: _without(c, -1, True, False),
        ),
        wrong(
            "ln-count-batch",
            "dx",
            "the formula with d = N, the batch size, where D belongs",
            "layer norm's statistics average over a row's D features: d = dout.shape[1]",
            lambda c: _count(c, 1, c.x.shape[0]),
        ),
        wrong(
            "ln-dbias-mean",
            "bias.grad",
            "dout.mean(0)",
            "bias is added to every row, so its gradient is the *sum* over the batch: dout.sum(0)",
            lambda c: c.dout.mean(0),
        ),
        wrong(
            "ln-over-batch",
            "out",
            "statistics over the batch (batch norm)",
            "layer norm takes the mean and variance of each row, over its D features: x.mean(1, keepdim=True)",
            lambda c: _norm(c, 0),
        ),
        wrong("ln-unbiased-var", "out", *_unbiased("number of features D"), lambda c: _norm(c, -1, unbiased=True)),
        wrong(
            "ln-dweight-per-row",
            "weight.grad",
            "(dout * xhat).sum(1), one number per row",
            "weight (D,) is shared by every row, so its gradient sums over the batch: (dout * xhat).sum(0)",
            lambda c: (c.dout * c.xhat).sum(1),
        ),
        wrong(
            "ln-dbias-per-row",
            "bias.grad",
            "dout.sum(1), one number per row",
            "bias (D,) is shared by every row, so its gradient sums over the batch: dout.sum(0)",
            lambda c: c.dout.sum(1),
        ),
        wrong(
            "ln-dweight-not-summed",
            "weight.grad",
            "dout * xhat, of shape (N, D)",
            "weight (D,) is used by every row: sum over the batch, (dout * xhat).sum(0)",
            lambda c: c.dout * c.xhat,
        ),
    ],
    where={
        "dx": "dx's three terms, each row on its own: directly, through the row's mean, through its variance",
        "weight.grad": "dweight = (dout * xhat).sum(0)",
        "bias.grad": "dbias = dout.sum(0)",
    },
)
