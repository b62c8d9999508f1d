"""The checks of exercise attention: CausalAttention on q, k, v (2, 4, 3), and its known mistakes."""

import torch

from ...mistakes import Mistake
from ..families import reduce_of
from ..spec import LayerSpec, normal, wrong

T, D = 4, 3


def _attend(c, scale=True, mask=True, diagonal=1, dim=-1):
    t, d = c.q.shape[1:]
    scores = c.q @ c.k.transpose(1, 2) * (1 / d if scale == "d" else d**-0.5 if scale else 1.0)
    if mask:
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(diagonal), float("-inf"))
    return torch.softmax(scores, dim)


def _shaped(label, n, t, d, std=1.0, numeric=True):
    return {
        "label": label,
        "inputs": lambda g: {x: normal(g, n, t, d, std=std) for x in ("q", "k", "v")},
        "numeric": numeric,
    }


def _random(g):
    n, t, d = (int(v) for v in torch.randint(1, 7, (3,), generator=g))
    return _shaped(f"N = {n}, T = {t}, d = {d}", n, t, d)


def _dscores(c, full_jacobian=True):
    datt = c.dout @ c.v.transpose(1, 2)
    if not full_jacobian:
        return c.att * (1 - c.att) * datt
    return c.att * (datt - (datt * c.att).sum(-1, keepdim=True))


def _formula(c):
    """The right backward from the named tensors (families.py replays it)."""
    scale = c.q.shape[-1] ** -0.5
    datt = c.dout @ c.v.transpose(1, 2)  # (N, T, T)
    dscores = c.att * (datt - reduce_of(c).sum(datt * c.att, -1, keepdim=True, label="datt * att"))
    return {
        "dq": dscores @ c.k * scale,
        "dk": dscores.transpose(1, 2) @ c.q * scale,
        "dv": c.att.transpose(1, 2) @ c.dout,
    }


def _context(c):
    return {"att": _attend(c)}


SPEC = LayerSpec(
    name="attention",
    cls="CausalAttention",
    ctor={},
    params={},
    inputs=lambda g: {n: normal(g, 2, T, D) for n in ("q", "k", "v")},
    reference=lambda t: {"out": _attend(t) @ t.v},
    context=_context,
    formula=_formula,
    saved={
        "q": "the queries",
        "k": "the keys",
        "v": "the values",
        "out": "the output att @ v",
        "att": "softmax of the scores",
    },
    configs=[
        _shaped("one position (T = 1), d = 4", 1, 1, 4),
        _shaped("a longer sequence (N = 1, T = 6, d = 2)", 1, 6, 2),
        _shaped(
            "large scores (q and k with std 30: exp overflows unless each row's max is subtracted)",
            2,
            4,
            3,
            std=30.0,
            numeric=False,
        ),
    ],
    random=_random,
    nan_hint=(
        "a row of scores with every key masked gives softmax 0/0 (the mask must keep the diagonal, key s = "
        "query t: triu(1)), or exp overflowed (subtract each row's max before exp, or use torch.softmax)"
    ),
    shared=[(("dq", "dk"), "dscores: softmax's backward, row by row (dq and dk both come from it)")],
    mistakes=[
        wrong(
            "attn-no-scale",
            "out",
            "softmax(q k^T) v, without 1/sqrt(d)",
            "the scores are divided by sqrt(d), the head size: q @ k.transpose(1, 2) / sqrt(d)",
            lambda c: _attend(c, scale=False) @ c.v,
        ),
        wrong(
            "attn-scale-one-over-d",
            "out",
            "softmax(q k^T / d) v: the scale 1/d",
            "the scores are divided by sqrt(d): with entries of variance 1, q . k has variance d, and 1/sqrt(d) "
            "brings it back to 1 (1/d shrinks the scores sqrt(d) times more)",
            lambda c: _attend(c, scale="d") @ c.v,
        ),
        wrong(
            "attn-no-mask",
            "out",
            "attention over every key, the future too",
            "a causal layer lets query t see the keys s <= t only: set the scores above the diagonal to -inf "
            "before the softmax",
            lambda c: _attend(c, mask=False) @ c.v,
        ),
        Mistake(
            "attn-scale-forward-only",
            "the gradient without the forward's 1/sqrt(d)",
            "the forward scaled the scores by 1/sqrt(d), so the backward through scores = q k^T * scale "
            "multiplies by the same scale: dq = dscores @ k * scale, dk = dscores^T @ q * scale",
            lambda c: {"dq": _dscores(c) @ c.k, "dk": _dscores(c).transpose(1, 2) @ c.q},
        ),
        wrong(
            "attn-dq-no-scale",
            "dq",
            "dscores @ k, without the scale (dk has it)",
            "scores = q k^T * scale, so dq = dscores @ k * scale: the forward's scale comes back in dq as in dk",
            lambda c: _dscores(c) @ c.k,
        ),
        wrong(
            "attn-dk-no-scale",
            "dk",
            "dscores^T @ q, without the scale (dq has it)",
            "scores = q k^T * scale, so dk = dscores^T @ q * scale: the forward's scale comes back in dk as in dq",
            lambda c: _dscores(c).transpose(1, 2) @ c.q,
        ),
        Mistake(
            "attn-diagonal-jacobian",
            "the gradient through softmax reduced to its diagonal att * (1 - att)",
            "each probability of a row depends on every score of that row: dscores = att * (datt - (datt * "
            "att).sum(-1, keepdim=True))",
            lambda c: {
                "dq": _dscores(c, False) @ c.k * c.q.shape[2] ** -0.5,
                "dk": _dscores(c, False).transpose(1, 2) @ c.q * c.q.shape[2] ** -0.5,
            },
        ),
        wrong(
            "attn-softmax-axis",
            "out",
            "softmax over the queries (dim 1) instead of the keys",
            "each query's weights over the keys sum to 1: softmax over the last axis, dim=-1",
            lambda c: _attend(c, dim=1) @ c.v,
        ),
        wrong(
            "attn-mask-diagonal",
            "out",
            "a mask that hides the diagonal too, triu(0)",
            "a query sees its own position: the future is the keys s > t, torch.ones(T, T).triu(1) (triu(0) also "
            "hides s = t, and the first row then has no key at all: nan)",
            lambda c: _attend(c, diagonal=0) @ c.v,
        ),
        wrong(
            "attn-dk-not-transposed",
            "dk",
            "dscores @ q * scale",
            "scores[t, s] = q[t] . k[s] * scale, so key s collects over the queries t: dk = dscores.transpose(1, "
            "2) @ q * scale",
            lambda c: _dscores(c) @ c.q * c.q.shape[2] ** -0.5,
        ),
        wrong(
            "attn-dv-not-transposed",
            "dv",
            "att @ dout",
            "out = att @ v, so value s collects over the queries t that attended to it: dv = att.transpose(1, 2) "
            "@ dout",
            lambda c: c.att @ c.dout,
        ),
    ],
    where={
        "dv": "dv = att^T @ dout",
        "dq": "dscores (softmax's Jacobian row by row), then dq = dscores @ k * scale",
        "dk": "dk = dscores^T @ q * scale",
        "out": "scores, the causal mask, softmax, att @ v",
    },
)
