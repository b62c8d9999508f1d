"""The checks of exercise tensor_parallel: TensorParallelMLP(3, 6, 9, ranks=3) on x (4, 3), beside one process.

The sharded MLP (column-parallel, tanh, row-parallel) must equal the one-process MLP, out = tanh(x W1^T + b1) W2^T +
b2, in its output and every gradient.  Every known mistake is a switch of ``_sharded``, rank 0's view of the
sharded MLP written out once; D, O and H/T all differ, so a shard of the wrong axis has the wrong shape.
"""

import torch

from ...mistakes import Mistake
from ..spec import LayerSpec, normal, uniform


def _sharded(
    c,
    f_forward_reduces=False,
    f_backward_reduces=True,
    g_forward_reduces=True,
    g_backward_reduces=False,
    bias_every_rank=False,
    bias_grad_every_rank=False,
):
    """Rank 0's out and dx, and the gathered parameter gradients, under the given mistakes (none by default)."""
    t = c.ranks
    x = c.x * t if f_forward_reduces else c.x  # an all-reduce of T copies of x
    w1s, b1s, w2s = c.weight1.chunk(t, 0), c.bias1.chunk(t, 0), c.weight2.chunk(t, 1)
    hs = [torch.tanh(x @ w.T + b) for w, b in zip(w1s, b1s, strict=True)]  # (N, H/T) each
    partials = [h @ w.T + (c.bias2 if bias_every_rank else 0) for h, w in zip(hs, w2s, strict=True)]  # (N, O) each
    out = sum(partials) if g_forward_reduces else partials[0]
    out = out if bias_every_rank else out + c.bias2
    dout = c.dout * t if g_backward_reduces else c.dout  # an all-reduce of T copies of dout
    das = [(dout @ w) * (1 - h**2) for h, w in zip(hs, w2s, strict=True)]  # (N, H/T) each
    partial_dx = [da @ w for da, w in zip(das, w1s, strict=True)]
    return {
        "out": out,
        "dx": sum(partial_dx) if f_backward_reduces else partial_dx[0],
        "weight1.grad": torch.cat([da.T @ x for da in das]),
        "bias1.grad": torch.cat([da.sum(0) for da in das]),
        "weight2.grad": torch.cat([dout.T @ h for h in hs], 1),
        "bias2.grad": c.dout.sum(0) * (t if bias_grad_every_rank else 1),
    }


def _only(*names, **switches):
    return lambda c: {n: v for n, v in _sharded(c, **switches).items() if n in names}


_BELOW_G = ("dx", "weight1.grad", "bias1.grad", "weight2.grad")
MISTAKES = [
    Mistake(
        "tp-f-forward-all-reduce",
        "f's forward an all-reduce",
        "every rank holds the whole x already: f's forward is the identity.  Summing T copies of x gives T x",
        _only("out", f_forward_reduces=True),
    ),
    Mistake(
        "tp-g-forward-identity",
        "g's forward the identity (no all-reduce)",
        "each rank's product h_r W2_r^T is a partial sum over its H/T hidden units only: g's forward must "
        "all-reduce them into out",
        _only("out", g_forward_reduces=False),
    ),
    Mistake(
        "tp-row-bias-every-rank",
        "the row-parallel bias added on every rank before g",
        "g sums the ranks' results, so a bias added on each rank is added T times.  Add it once, after g",
        _only("out", bias_every_rank=True),
    ),
    Mistake(
        "tp-f-backward-identity",
        "f's backward the identity (no all-reduce)",
        "x feeds every rank's rows of W1, so dL/dx is the sum of what comes back through each rank: f's "
        "backward must all-reduce the ranks' partial dx (yours is rank 0's share alone)",
        _only("dx", f_backward_reduces=False),
    ),
    Mistake(
        "tp-g-backward-all-reduce",
        "g's backward an all-reduce too",
        "out = sum of the partial products, so each one receives dout as it is: g's backward is the identity.  "
        "Every rank holds the same dout already, and summing T copies makes every gradient below g T times too "
        "large",
        _only(*_BELOW_G, g_backward_reduces=True),
    ),
    Mistake(
        "tp-row-bias-grad-every-rank",
        "the row-parallel bias's gradient added once per rank",
        "the bias is one tensor added once, after g: every rank computes the same dout.sum(0), and it goes into "
        "bias.grad once, not T times",
        _only("bias2.grad", bias_grad_every_rank=True),
    ),
]
WRONG_AXIS = Mistake(
    "tp-wrong-axis",
    "split along the other axis",
    "a column-parallel Linear splits its outputs, the rows of W1 (H/T, D) with the matching slice of b1, so each rank "
    "computes whole entries of its slice of h; a row-parallel one splits its inputs, the columns of W2 (O, H/T), to "
    "match the slice of h the rank holds.  shard(weight1, 0, T) and shard(weight2, 1, T)",
)


def _layout(c):
    return {
        "fc1.weights": list(c.weight1.chunk(c.ranks, 0)),
        "fc1.biases": list(c.bias1.chunk(c.ranks, 0)),
        "fc2.weights": list(c.weight2.chunk(c.ranks, 1)),
    }


def _wrong_axis(c):
    t = c.ranks
    return {"fc1.weights": list(c.weight1.chunk(t, 1)), "fc2.weights": list(c.weight2.chunk(t, 0))}


def _shaped(label, n, d, h, o, t):
    return {
        "label": label,
        "ctor": {"in_features": d, "hidden_features": h, "out_features": o, "ranks": t},
        "params": {
            "weight1": lambda g: uniform(g, h, d),
            "bias1": lambda g: normal(g, h, std=0.5, mean=0.3),
            "weight2": lambda g: uniform(g, o, h),
            "bias2": lambda g: normal(g, o, mean=0.5),
        },
        "inputs": lambda g: {"x": normal(g, n, d)},
    }


def _random(g):
    n, d, o, t, k = (int(v) for v in torch.randint(1, 5, (5,), generator=g))
    return _shaped(f"N = {n}, D = {d}, H = {t * k}, O = {o}, T = {t}", n, d, t * k, o, t)


_DEFAULT = _shaped("", 4, 3, 6, 9, 3)
SPEC = LayerSpec(
    name="tensor_parallel",
    cls="TensorParallelMLP",
    ctor=_DEFAULT["ctor"],
    params=_DEFAULT["params"],
    inputs=_DEFAULT["inputs"],
    reference=lambda t: {"out": torch.tanh(t.x @ t.weight1.T + t.bias1) @ t.weight2.T + t.bias2},
    mistakes=MISTAKES + [WRONG_AXIS],
    layout=_layout,
    layout_mistakes=[(WRONG_AXIS, _wrong_axis)],
    replicas=("outs", "dxs"),
    versus="the one-process MLP (autograd's gradients)",
    configs=[
        _shaped("one example (N = 1)", 1, 3, 6, 9, 3),
        _shaped("two ranks: N = 3, D = 4, H = 4, O = 2, T = 2", 3, 4, 4, 2, 2),
        _shaped("one hidden unit a rank: H = T = 4", 2, 4, 4, 3, 4),
    ],
    random=_random,
    shared=[(_BELOW_G, "everything below g's backward: g's backward, then each rank's W2_r and tanh")],
    where={
        "out": "out = g(the ranks' h_r @ W2_r^T) + bias2: f's and g's forwards, and the bias once",
        "dx": "dx = f's backward of the ranks' partial dx (each da_r @ W1_r)",
        "weight1.grad": "rank r's da_r.T @ x into its rows of weight1.grad",
        "bias1.grad": "rank r's da_r.sum(0) into its rows of bias1.grad",
        "weight2.grad": "rank r's dout.T @ h_r into its columns of weight2.grad (after g's backward)",
        "bias2.grad": "dout.sum(0), once",
    },
)
