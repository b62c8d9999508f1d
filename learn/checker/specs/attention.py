"""The checks of exercise attention: CausalAttention on q, k, v (2, 4, 3), and its known mistakes."""
import torch

from ...mistakes import Mistake
from ..spec import LayerSpec, normal, wrong

T, D = 4, 3


def _attend(c, scale=True, mask=True):
    scores = c.q @ c.k.transpose(1, 2) * (D ** -0.5 if scale else 1.0)
    if mask:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, -1)


def _dscores(c, full_jacobian=True):
    datt = c.dout @ c.v.transpose(1, 2)
    if not full_jacobian:
        return c.att * (1 - c.att) * datt
    return c.att * (datt - (datt * c.att).sum(-1, keepdim=True))


def _context(c):
    return {"att": _attend(c)}


SPEC = LayerSpec(
    name="attention", cls="CausalAttention", ctor={}, params={},
    inputs=lambda g: {n: normal(g, 2, T, D) for n in ("q", "k", "v")},
    reference=lambda t: {"out": _attend(t) @ t.v}, context=_context,
    mistakes=[
        wrong("attn-no-scale", "out", "softmax(q k^T) v, without 1/sqrt(d)",
              "the scores are divided by sqrt(d), the head size: q @ k.transpose(1, 2) / sqrt(d)",
              lambda c: _attend(c, scale=False) @ c.v),
        wrong("attn-no-mask", "out", "attention over every key, the future too",
              "a causal layer lets query t see the keys s <= t only: set the scores above the diagonal to -inf "
              "before the softmax", lambda c: _attend(c, mask=False) @ c.v),
        Mistake("attn-scale-forward-only", "the gradient without the forward's 1/sqrt(d)",
                "the forward scaled the scores by 1/sqrt(d), so the backward through scores = q k^T * scale "
                "multiplies by the same scale: dq = dscores @ k * scale, dk = dscores^T @ q * scale",
                lambda c: {"dq": _dscores(c) @ c.k, "dk": _dscores(c).transpose(1, 2) @ c.q}),
        Mistake("attn-diagonal-jacobian", "the gradient through softmax reduced to its diagonal att * (1 - att)",
                "each probability of a row depends on every score of that row: dscores = att * (datt - (datt * "
                "att).sum(-1, keepdim=True))",
                lambda c: {"dq": _dscores(c, False) @ c.k * D ** -0.5,
                           "dk": _dscores(c, False).transpose(1, 2) @ c.q * D ** -0.5}),
        wrong("attn-dk-not-transposed", "dk", "dscores @ q * scale",
              "scores[t, s] = q[t] . k[s] * scale, so key s collects over the queries t: dk = dscores.transpose(1, "
              "2) @ q * scale", lambda c: _dscores(c) @ c.q * D ** -0.5),
        wrong("attn-dv-not-transposed", "dv", "att @ dout",
              "out = att @ v, so value s collects over the queries t that attended to it: dv = att.transpose(1, 2) "
              "@ dout", lambda c: c.att @ c.dout),
    ],
    where={"dv": "dv = att^T @ dout", "dq": "dscores (softmax's Jacobian row by row), then dq = dscores @ k * scale",
           "dk": "dk = dscores^T @ q * scale", "out": "scores, the causal mask, softmax, att @ v"},
)
