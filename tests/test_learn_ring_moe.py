"""The ring_attention and moe_dispatch exercises' worked solutions: their gradients are autograd's in float64, and
they are the library's math (training/parallel/ring_attention.py's merge, layers/moe.py's routing)."""

import math

import pytest
import torch

from layers.moe import route
from learn.exercises import BY_NAME
from learn.source import solution_text
from training.parallel.ring_attention import attend_block, merge

F64 = torch.float64
TOL = 1e-12  # float64 round-off through a few products and a log-sum-exp: about 1e-15


def solution(name: str) -> dict:
    """The worked solution's module namespace, run from its text as a learner's file is."""
    namespace: dict = {}
    exec(compile(solution_text(BY_NAME[name], f"{name}.py"), f"{name}.py", "exec"), namespace)
    return namespace


def close(mine: torch.Tensor, want: torch.Tensor) -> bool:
    return bool((mine - want).abs().max() <= TOL * max(1.0, float(want.abs().max())))


@pytest.mark.parametrize("n, t, d, ranks", [(2, 6, 4, 3), (1, 8, 3, 4), (3, 5, 2, 1), (2, 9, 5, 3)])
def test_ring_attention_equals_autograd(n, t, d, ranks):
    g = torch.Generator().manual_seed(t * ranks)
    q, k, v, dout = (torch.randn(n, t, d, generator=g, dtype=F64) for _ in range(4))
    layer = solution("ring_attention")["RingAttention"](ranks)
    out = layer.forward(q, k, v)
    mine = layer.backward(dout)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    want_out = torch.softmax(leaves[0] @ leaves[1].transpose(1, 2) / math.sqrt(d), -1) @ leaves[2]
    want = torch.autograd.grad(want_out, leaves, dout)
    assert close(out, want_out.detach())
    for name, a, b in zip(("dq", "dk", "dv"), mine, want, strict=True):
        assert close(a, b), f"{name}: {float((a - b).abs().max()):.1e}"
    assert close(layer.lse, torch.logsumexp(q @ k.transpose(1, 2) / math.sqrt(d), -1, keepdim=True))


def test_ring_attentions_merge_is_the_librarys():
    """Rank r's running (o, lse), merged in the ring's order, equals training/parallel/ring_attention.py's merge."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 3, generator=g, dtype=F64) for _ in range(3))
    ranks, scale = 4, 3**-0.5
    layer = solution("ring_attention")["RingAttention"](ranks)
    out = layer.forward(q, k, v)
    qs, ks, vs = (x.chunk(ranks, 1) for x in (q, k, v))
    for r in range(ranks):
        state = attend_block(qs[r], ks[r], vs[r], scale, causal=False)
        for s in range(1, ranks):
            b = (r - s) % ranks
            state = merge(*state, *attend_block(qs[r], ks[b], vs[b], scale, causal=False))
        assert close(out.chunk(ranks, 1)[r], state[0]) and close(layer.lse.chunk(ranks, 1)[r], state[1])


def _moe_case(g, n, c, o, experts, top_k, capacity):
    x = torch.randn(n, c, generator=g, dtype=F64)
    chosen = torch.rand(n, experts, generator=g).argsort(-1)[:, :top_k]  # (N, k) distinct
    gates = torch.rand(n, top_k, generator=g, dtype=F64) + 0.1
    weight = torch.randn(experts, o, c, generator=g, dtype=F64)
    return x, gates, chosen, weight


@pytest.mark.parametrize(
    "n, c, o, experts, top_k, capacity", [(6, 4, 5, 3, 2, 3), (9, 3, 2, 4, 1, 2), (5, 2, 3, 3, 3, 9)]
)
def test_moe_dispatch_equals_autograd(n, c, o, experts, top_k, capacity):
    g = torch.Generator().manual_seed(n)
    x, gates, chosen, weight = _moe_case(g, n, c, o, experts, top_k, capacity)
    ns = solution("moe_dispatch")
    layer = ns["MoEDispatchCombine"](experts, c, o, capacity)
    layer.weight = weight.clone()
    dout = torch.randn(n, o, generator=g, dtype=F64)
    out = layer.forward(x, gates, chosen)
    dx, dgates = layer.backward(dout)
    kept = ns["keep"](chosen, experts, capacity)
    leaves = [t.clone().requires_grad_() for t in (x, gates, weight)]
    lx, lg, lw = leaves
    want_out = sum(  # out[n] = sum_j kept g y_e[n], written without any dispatch: every token through every expert
        (kept[:, j, None] * lg[:, j, None] * torch.einsum("nc,noc->no", lx, lw[chosen[:, j]]) for j in range(top_k)),
        torch.zeros(n, o, dtype=F64),
    )
    want = torch.autograd.grad(want_out, leaves, dout)
    assert close(out, want_out.detach())
    for name, a, b in zip(("dx", "dgates", "weight.grad"), (dx, dgates, layer.weight.grad), want, strict=True):
        assert close(a, b), f"{name}: {float((a - b).abs().max()):.1e}"
    assert not (~kept).all() or (dgates == 0).all()
    assert (dgates[~kept] == 0).all(), "a dropped assignment has no gate gradient"


def test_moe_dispatchs_keep_is_the_librarys_route():
    """keep() marks the assignments layers/moe.py's route() keeps, for the experts its top-k chose."""
    g = torch.Generator().manual_seed(1)
    for n, experts, top_k, capacity in ((12, 4, 2, 5), (7, 3, 1, 2), (10, 5, 3, 4)):
        probs = torch.softmax(torch.randn(n, experts, generator=g, dtype=F64), -1)
        chosen, _, _, kept = route(probs, top_k, capacity, normalize=False)
        mine = solution("moe_dispatch")["keep"](chosen, experts, capacity)
        assert torch.equal(mine, kept) and (~kept).any()
