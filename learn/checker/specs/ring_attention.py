"""The checks of exercise ring_attention: RingAttention(ranks=3) on q, k, v (3, 6, 4), beside whole-row attention.

Every known mistake is a switch of ``_ring``, the simulated ring written out once: rank r's query block meets the
key/value blocks r, r-1, ... in the ring's order, so a merge that depends on the order (no rescaling) is replayed
in the order the learner's loop merges.  No configuration has scores past exp's range (the attention exercise's
has): P = exp(S - lse) recomputed from an lse of size |S| is off by about 1e-16 |S|, and in the saturated rows such
scores make, dq and dk are too small for that to stay under the check's 1e-9 (FlashAttention's backward is
conditioned the same way).
"""

import torch

from ...mistakes import Mistake
from ..spec import LayerSpec, normal


def _ring(c, rescale=True, lse_sum=True, block_lse=False, delta=True, dkv_add=True, dq_add=True):
    """out, dq, dk, dv of the ring under the given mistakes (none by default)."""
    R, scale = c.ranks, c.q.shape[-1] ** -0.5
    qs, ks, vs, dos = (list(t.chunk(R, 1)) for t in (c.q, c.k, c.v, c.dout))
    outs, lses, block_lses = [], [], {}
    for r in range(R):
        o, lse = torch.zeros_like(qs[r]), torch.full((*qs[r].shape[:-1], 1), float("-inf"), dtype=c.q.dtype)
        for s in range(R):
            b = (r - s) % R
            scores = qs[r] @ ks[b].transpose(1, 2) * scale  # (N, n, n)
            lse_b = block_lses[r, b] = torch.logsumexp(scores, -1, keepdim=True)
            o_b = torch.exp(scores - lse_b) @ vs[b]
            new = torch.logaddexp(lse, lse_b) if lse_sum else torch.maximum(lse, lse_b)
            o = (torch.exp(lse - new) if rescale else 1.0) * o + torch.exp(lse_b - new) * o_b
            lse = new
        outs.append(o)
        lses.append(lse)
    out = torch.cat(outs, 1)
    deltas = ((c.dout * out).sum(-1, keepdim=True) if delta else torch.zeros_like(c.dout[..., :1])).chunk(R, 1)
    dqs, dks, dvs = ([torch.zeros_like(t) for t in ts] for ts in (qs, ks, vs))
    for r in range(R):
        for s in range(R):
            b = (r - s) % R
            p = torch.exp(qs[r] @ ks[b].transpose(1, 2) * scale - (block_lses[r, b] if block_lse else lses[r]))
            ds = p * (dos[r] @ vs[b].transpose(1, 2) - deltas[r])
            dq_b, dk_b, dv_b = ds @ ks[b] * scale, ds.transpose(1, 2) @ qs[r] * scale, p.transpose(1, 2) @ dos[r]
            dqs[r] = dqs[r] + dq_b if dq_add else dq_b
            dks[b] = dks[b] + dk_b if dkv_add else dk_b
            dvs[b] = dvs[b] + dv_b if dkv_add else dv_b
    return {"out": out, "dq": torch.cat(dqs, 1), "dk": torch.cat(dks, 1), "dv": torch.cat(dvs, 1)}


def _only(*names, **switches):
    return lambda c: {n: v for n, v in _ring(c, **switches).items() if n in names}


MISTAKES = [
    Mistake(
        "ring-no-rescale",
        "o + exp(lse_b - new) * o_b: the running output not rescaled to the merged lse",
        "o was normalised by the old sum exp(lse); once a block raises it to exp(new), every part must be "
        "re-weighted by its share of the new sum: o = exp(lse - new) * o + exp(lse_b - new) * o_b (the online "
        "softmax's rescaling by the new max, here in log-sum-exp form)",
        _only("out", rescale=False),
    ),
    Mistake(
        "ring-lse-max",
        "the merged lse as max(lse, lse_b): the running max without its sum",
        "the merged statistic is the log of the summed exponentials, logaddexp(lse, lse_b) = log(exp(lse) + "
        "exp(lse_b)), not their larger one: with max the weights exp(lse - new) + exp(lse_b - new) exceed 1 and "
        "the output is no longer an average of the values",
        _only("out", lse_sum=False),
    ),
    Mistake(
        "ring-block-lse",
        "each block's P = exp(S - lse_b) from the block's own log-sum-exp",
        "that is the block's own softmax, as if its keys were the only ones; the output is the softmax over every "
        "key, so its probabilities are exp(S - lse) with the merged lse of the whole row, kept from the forward",
        _only("dq", "dk", "dv", block_lse=True),
    ),
    Mistake(
        "ring-no-delta",
        "dS = P * dP, without subtracting D = rowsum(dout * out)",
        "each probability of a row depends on every score of the row (softmax's Jacobian): dS = P * (dP - D), "
        "where D = rowsum(dP * P) over the whole row equals rowsum(dout * out), which no single block sees",
        _only("dq", "dk", delta=False),
    ),
    Mistake(
        "ring-dkv-overwritten",
        "dk_b and dv_b set by each query block that meets block b (=), not added (+=)",
        "a key/value block meets every rank's queries as it travels round the ring, and its gradient is the sum "
        "of all their shares: yours keeps the last rank's alone.  Add: dk_b = dk_b + ..., dv_b = dv_b + ...",
        _only("dk", "dv", dkv_add=False),
    ),
    Mistake(
        "ring-dq-overwritten",
        "dq_a set at each step of the ring (=), not added (+=)",
        "query block a meets every key/value block, and its gradient is the sum over them: yours keeps the last "
        "block's share alone.  Add: dq_a = dq_a + ...",
        _only("dq", dq_add=False),
    ),
]


def _shaped(label, n, t, d, ranks, std=1.0):
    return {
        "label": label,
        "ctor": {"ranks": ranks},
        "inputs": lambda g: {x: normal(g, n, t, d, std=std if x != "v" else 1.0) for x in ("q", "k", "v")},
    }


def _random(g):
    n, blk, d, ranks = (int(v) for v in torch.randint(1, 5, (4,), generator=g))
    return _shaped(f"N = {n}, T = {ranks * blk}, d = {d}, R = {ranks}", n, ranks * blk, d, ranks)


def _attend(t):
    return torch.softmax(t.q @ t.k.transpose(1, 2) * t.q.shape[-1] ** -0.5, -1) @ t.v


_DEFAULT = _shaped("", 3, 6, 4, 3)
SPEC = LayerSpec(
    name="ring_attention",
    cls="RingAttention",
    ctor=_DEFAULT["ctor"],
    params={},
    inputs=_DEFAULT["inputs"],
    reference=lambda t: {"out": _attend(t)},
    mistakes=MISTAKES,
    versus="whole-row attention (autograd's gradients)",
    configs=[
        _shaped("one rank (R = 1): a single block, nothing to merge", 2, 5, 3, 1),
        _shaped("two ranks, one position a block: N = 1, T = 2, d = 5", 1, 2, 5, 2),
        _shaped("four ranks: N = 2, T = 12, d = 2", 2, 12, 2, 4),
        _shaped("larger scores (q and k with std 3): each block's softmax far from the row's", 2, 6, 3, 3, std=3.0),
    ],
    random=_random,
    nan_hint=(
        "exp overflowed (use torch.logsumexp for a block's lse and torch.logaddexp to merge), or a merge computed "
        "-inf - (-inf): start from lse = -inf and take exp(lse - new) only with new, the merged lse, finite"
    ),
    shared=[(("dq", "dk", "dv"), "each block's P = exp(S - lse), from the merged lse of the forward")],
    where={
        "out": "each block's lse_b and o_b, and the merge: new = logaddexp(lse, lse_b), both parts re-weighted",
        "dq": "dS = P * (dout_a v_b^T - D_a), then dq_a += dS k_b * scale, over every block b",
        "dk": "dk_b += dS^T q_a * scale, over every query block a",
        "dv": "dv_b += P^T dout_a, over every query block a",
    },
)
