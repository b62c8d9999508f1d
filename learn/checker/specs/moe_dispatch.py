"""The checks of exercise moe_dispatch: MoEDispatchCombine(3 experts, 4 -> 5, capacity 3) on 6 tokens sent to 2
experts each, some of them dropped, and its known mistakes.

Every known mistake is a switch of ``_moe``, the dispatch and combine written out once, expert by expert in the
learner's order (an overwrite keeps the last expert's share).  A capacity below ceil(k N / K) makes the busiest
expert drop an assignment whatever the draw.
"""

import math

import torch

from ...mistakes import Mistake
from ..spec import LayerSpec, normal, uniform


def _kept(experts, n_experts, capacity):
    """layers/moe.py's priority: all first choices in token order, then all second choices, ..."""
    order = experts.T.reshape(-1)
    place = torch.nn.functional.one_hot(order, n_experts).cumsum(0).gather(1, order[:, None]).squeeze(1) - 1
    return (place < capacity).view(experts.shape[1], -1).T  # (N, k)


def _moe(c, capacity=True, gated=True, gate_grad=True, backward_capacity=True, gate_in_backward=True, dx_add=True):
    """out, dx, dgates and weight.grad under the given mistakes (none by default)."""
    kept = _kept(c.experts, c.n_experts, c.capacity)
    every = torch.ones_like(kept)
    x, gates, w = c.x, c.gates, c.weight
    out = torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype)
    dx, dgates, dweight = torch.zeros_like(x), torch.zeros_like(gates), torch.zeros_like(w)
    for e in range(c.n_experts):
        tokens, slots = ((c.experts == e) & (kept if capacity else every)).nonzero(as_tuple=True)
        y = x[tokens] @ w[e].T  # (M, O)
        out.index_add_(0, tokens, (gates[tokens, slots, None] if gated else 1.0) * y)
        tokens, slots = ((c.experts == e) & (kept if backward_capacity else every)).nonzero(as_tuple=True)
        y = x[tokens] @ w[e].T
        if gate_grad:
            dgates[tokens, slots] = (c.dout[tokens] * y).sum(-1)
        dy = (gates[tokens, slots, None] if gate_in_backward else 1.0) * c.dout[tokens]
        dweight[e] = dy.T @ x[tokens]
        if dx_add:
            dx.index_add_(0, tokens, dy @ w[e])
        else:
            dx[tokens] = dy @ w[e]
    return {"out": out, "dx": dx, "dgates": dgates, "weight.grad": dweight}


def _only(*names, **switches):
    return lambda c: {n: v for n, v in _moe(c, **switches).items() if n in names}


MISTAKES = [
    Mistake(
        "moe-capacity-ignored",
        "every assignment combined, the dropped ones too",
        "an expert takes at most `capacity` tokens: the assignments keep() marks False were dropped and add nothing "
        "to out (in a transformer the token passes through the residual alone)",
        _only("out", capacity=False),
    ),
    Mistake(
        "moe-gates-not-applied",
        "the sum of the expert outputs, without their gates",
        "the combine is a gate-weighted sum: out[n] = sum_j gates[n, j] y_e[n]; without the gates the router "
        "learns nothing from the loss",
        _only("out", gated=False),
    ),
    Mistake(
        "moe-no-gate-grad",
        "zero: the gates' gradient dropped",
        "the combine multiplies y_e by its gate, so the gate has a gradient, dout[n] . y_e[n] for each kept "
        "assignment; it is the router's only way to learn which expert served the token well",
        _only("dgates", gate_grad=False),
    ),
    Mistake(
        "moe-dropped-get-gradient",
        "the gradient of every assignment, the dropped ones too",
        "a dropped assignment took no part in the forward, so it gets no gradient: no share of dx, no dgates "
        "entry (0) and no share of its expert's weight.grad.  The backward's assignments are the forward's kept "
        "ones",
        _only("dx", "dgates", "weight.grad", backward_capacity=False),
    ),
    Mistake(
        "moe-gate-forgotten-in-backward",
        "dy_e = dout[tokens], without the gate",
        "out adds gates[n, j] * y_e[n], so the expert's output receives dout scaled by the same gate: dy_e = "
        "gates[tokens, slots, None] * dout[tokens], and dW_e and dx follow from it",
        _only("dx", "weight.grad", gate_in_backward=False),
    ),
    Mistake(
        "moe-topk-not-summed",
        "dx[tokens] = dy_e @ W_e: each token's gradient from one expert only",
        "a token sent to k experts was read by each of them, so its gradient is the sum of their shares: "
        "dx.index_add_(0, tokens, dy_e @ W_e) (or dx[tokens] += within one expert, whose tokens are distinct); an "
        "assignment, or an indexed += over all k N assignments at once, keeps one share per token",
        _only("dx", dx_add=False),
    ),
]


def _shaped(label, n, c, o, k, top_k, capacity):
    def inputs(g):
        experts = torch.rand(n, k, generator=g).argsort(-1)[:, :top_k]  # (N, k) distinct experts per token
        return {"x": normal(g, n, c), "gates": uniform(g, n, top_k, lo=0.1, hi=1.0), "experts": experts}

    return {
        "label": label,
        "ctor": {"n_experts": k, "in_features": c, "out_features": o, "capacity": capacity},
        "params": {"weight": lambda g: normal(g, k, o, c, std=0.5)},
        "inputs": inputs,
    }


def _random(g):
    n, c, o, k = (int(v) for v in torch.randint(2, 7, (4,), generator=g))
    top_k = int(torch.randint(1, k + 1, (), generator=g))
    capacity = max(1, math.ceil(top_k * n / k) - 1)  # below the busiest expert's load: something is dropped
    return _shaped(f"N = {n}, C = {c}, O = {o}, K = {k}, k = {top_k}, capacity {capacity}", n, c, o, k, top_k, capacity)


def _reference(t):
    out = torch.zeros(t.x.shape[0], t.weight.shape[1], dtype=t.x.dtype)
    kept = _kept(t.experts, t.n_experts, t.capacity)
    for e in range(t.n_experts):
        tokens, slots = ((t.experts == e) & kept).nonzero(as_tuple=True)
        out = out.index_add(0, tokens, t.gates[tokens, slots, None] * (t.x[tokens] @ t.weight[e].T))
    return {"out": out}


_DEFAULT = _shaped("", 6, 4, 5, 3, 2, 3)
SPEC = LayerSpec(
    name="moe_dispatch",
    cls="MoEDispatchCombine",
    ctor=_DEFAULT["ctor"],
    params=_DEFAULT["params"],
    inputs=_DEFAULT["inputs"],
    reference=_reference,
    returns=("dx", "dgates"),
    mistakes=MISTAKES,
    configs=[
        _shaped("one expert a token (k = 1, Switch's): N = 5, C = 3, O = 2, K = 4, capacity 1", 5, 3, 2, 4, 1, 1),
        _shaped("room for every token (capacity 8): N = 4, C = 2, O = 3, K = 2, k = 2", 4, 2, 3, 2, 2, 8),
        _shaped("every token to every expert: N = 7, C = 3, O = 4, K = 3, k = 3, capacity 5", 7, 3, 4, 3, 3, 5),
    ],
    random=_random,
    where={
        "out": "dispatch (x[tokens] of each expert's kept assignments), y_e = x_e W_e^T, and the gated combine",
        "dx": "dy_e @ W_e scattered back with index_add_ over each token's kept experts",
        "dgates": "dout[tokens] . y_e for each kept assignment, 0 for a dropped one",
        "weight.grad": "dW_e = dy_e^T x_e, with dy_e = gate * dout[tokens], over expert e's kept tokens",
    },
)
