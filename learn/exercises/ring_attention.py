"""Exercise ring_attention: attention over a sequence split among R ranks, as ring attention computes it: each
block's partial softmax merged by its log-sum-exp, and the backward block by block from the merged statistics.

Shapes (N = batch size, T = sequence length, d = head size, R = ranks, n = T / R, a block):
    q, k, v (N, T, d) -> out (N, T, d) = softmax(q k^T / sqrt(d)) v, every query over every key (no mask)
The ring is simulated in one process: rank r holds block r of q, k and v (positions r n .. (r + 1) n); at step
s = 0 .. R-1 it holds the key/value block b = (r - s) mod R, which has travelled round the ring to it.  Query block
a meeting key/value block b gives a partial softmax, over the block's keys only:
    S = q_a k_b^T / sqrt(d) (N, n, n)    lse_b = logsumexp(S) over the keys (N, n, 1)    o_b = exp(S - lse_b) v_b
Partials merge exactly, in any order, into a running (o, lse), from o = 0 and lse = -inf: the merged lse is the
log of the summed exponentials, torch.logaddexp(lse, lse_b), and o is a weighted mean of the two parts (each
weighted by its share of the merged sum).  No rank ever holds a whole row of scores.
The backward (FlashAttention's) keeps out and each row's merged lse (N, T, 1) and recomputes each block's scores:
its probabilities are those of the softmax out was computed with, over the whole row.  Softmax's backward needs a
sum over the whole row, D = rowsum(dP * P), which no block sees; it equals rowsum(dout * out) (N, T, 1), known
before any block arrives.  Then each meeting adds its share to dq_a, dk_b and dv_b as attention's backward does:
dq_a stays on rank a; dk_b and dv_b travel round the ring with their block, each rank adding its queries' share.
(The causal ring of training/parallel/ring_attention.py skips the blocks in a query's future and masks the
diagonal one; the merging and the backward are the same.)
{check}
"""
import torch


def blocks(t, ranks):
    """t (N, T, ...) cut into `ranks` equal blocks of positions; element r is rank r's block (a view of t)."""
    if t.shape[1] % ranks:
        raise ValueError(f"a sequence of {t.shape[1]} positions does not divide among {ranks} ranks")
    return list(t.chunk(ranks, 1))


class RingAttention:
    def __init__(self, ranks):
        self.ranks = ranks

    def forward(self, q, k, v):
        """q, k, v (N, T, d) -> out (N, T, d)."""
        # TODO: for each rank r, its query block meets the key/value blocks b = (r - s) mod R, s = 0 .. R-1: each
        #       block's scores (N, n, n), lse_b (N, n, 1) and o_b (N, n, d), merged into the running (o, lse).
        #       out (N, T, d) is the ranks' o side by side; keep what backward needs, the merged lse (N, T, 1) too.
        ### BEGIN SOLUTION
        self.scale = q.shape[-1] ** -0.5
        qs, ks, vs = (blocks(t, self.ranks) for t in (q, k, v))
        outs, lses = [], []
        for r in range(self.ranks):
            o = torch.zeros_like(qs[r])  # (N, n, d)
            lse = torch.full((*qs[r].shape[:-1], 1), float("-inf"), dtype=q.dtype)  # (N, n, 1): nothing seen yet
            for s in range(self.ranks):
                b = (r - s) % self.ranks  # the key/value block rank r holds at step s
                scores = qs[r] @ ks[b].transpose(1, 2) * self.scale  # (N, n, n)
                lse_b = torch.logsumexp(scores, -1, keepdim=True)  # (N, n, 1)
                o_b = torch.exp(scores - lse_b) @ vs[b]  # (N, n, d): the block's own softmax
                new = torch.logaddexp(lse, lse_b)  # (N, n, 1)
                o = torch.exp(lse - new) * o + torch.exp(lse_b - new) * o_b  # each part by its share of the sum
                lse = new
            outs.append(o)
            lses.append(lse)
        out = torch.cat(outs, 1)  # (N, T, d)
        self.q, self.k, self.v, self.out, self.lse = q, k, v, out, torch.cat(lses, 1)  # lse (N, T, 1)
        ### END SOLUTION
        return out

    def backward(self, dout):
        """dout (N, T, d) -> (dq, dk, dv), each (N, T, d)."""
        # TODO: D = rowsum(dout * out) (N, T, 1); then the same meetings as the forward: each block's P from the
        #       merged lse, and its shares of dq_a, dk_b and dv_b added up (a block meets every query block).
        ### BEGIN SOLUTION
        qs, ks, vs, douts, lses = (blocks(t, self.ranks) for t in (self.q, self.k, self.v, dout, self.lse))
        deltas = blocks((dout * self.out).sum(-1, keepdim=True), self.ranks)  # D (N, n, 1) per block
        dqs, dks, dvs = ([torch.zeros_like(t) for t in ts] for ts in (qs, ks, vs))
        for r in range(self.ranks):
            for s in range(self.ranks):
                b = (r - s) % self.ranks
                p = torch.exp(qs[r] @ ks[b].transpose(1, 2) * self.scale - lses[r])  # (N, n, n) recomputed
                dvs[b] = dvs[b] + p.transpose(1, 2) @ douts[r]  # (N, n, d)
                dscores = p * (douts[r] @ vs[b].transpose(1, 2) - deltas[r])  # (N, n, n)
                dqs[r] = dqs[r] + dscores @ ks[b] * self.scale
                dks[b] = dks[b] + dscores.transpose(1, 2) @ qs[r] * self.scale
        dq, dk, dv = (torch.cat(ds, 1) for ds in (dqs, dks, dvs))
        ### END SOLUTION
        return dq, dk, dv
