"""Ring attention by hand (Liu et al. 2023): causal attention over a sequence split zigzag over a ring of C ranks,
forward and backward, the partial softmaxes merged by their log-sum-exps as FlashAttention merges key blocks.

Shape legend: B = batch, H = heads, T = the whole sequence, C = the ring's ranks, n = T / 2C (a chunk), E = a
head's size.  The sequence is cut into 2C chunks; rank r holds two, chunk r (early) and chunk 2C-1-r (late), so
every rank has the same causal work (picotron's and ring-flash-attention's zigzag): its q, k and v are
(B, H, 2n, E), its early chunk's n positions then its late chunk's.

Forward.  Each rank's key/value block travels once around the ring: at step s rank r holds the block of rank
(r - s) mod C, passes it to rank r+1 and receives the next from rank r-1 while it computes.  A query chunk a
meets a key chunk b fully when b < a, causally (the diagonal mask) when b = a, and not at all when b > a; each
meeting gives a partial output and the log-sum-exp of its scores,

    S = scale q_a k_b^T    lse_b = log sum_j exp(S_j)    o_b = softmax(S) v_b        (n, n), (n, 1), (n, E)

and partials merge exactly, whatever their order (the softmax of the union is the weighted mean of the parts):

    lse = log(exp(lse_1) + exp(lse_2))    o = exp(lse_1 - lse) o_1 + exp(lse_2 - lse) o_2

Backward (FlashAttention's, block by block).  With the merged lse and the output o kept, each block's
probabilities are P = exp(S - lse) -- the final softmax, not the block's -- and with D = rowsum(dO * o):

    dV_b += P^T dO    dP = dO v_b^T    dS = P * (dP - D)    dq_a += scale dS k_b    dK_b += scale dS^T q_a

dq stays home; each key/value block travels round the ring again, now with its gradient dK_b, dV_b, to which every
rank it visits adds its queries' share; after C steps the gradient arrives back at the block's owner.

Communication per attention, each pass point to point to the next rank: forward C-1 passes of (k, v), backward
C-1 of (k, v) and C of (dk, dv).  A (k, v) pass overlaps the block's computation; a (dk, dv) pass follows it, since
it carries that computation's result.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from layers.layer import BaseLayer

# -- the zigzag layout --------------------------------------------------------------------------------------------


def zigzag_chunks(rank: int, ranks: int) -> tuple[int, int]:
    """The two chunks (of 2C) rank ``rank`` holds: one early, one late."""
    return rank, 2 * ranks - 1 - rank


def zigzag_positions(seq_len: int, rank: int, ranks: int, device=None) -> Tensor:
    """The rank's positions in the whole sequence, its early chunk's then its late chunk's: (T / C,)."""
    if seq_len % (2 * ranks):
        raise ValueError(
            f"context parallelism: sequence length {seq_len} does not divide into 2 x {ranks} chunks (each rank "
            f"holds two)"
        )
    n = seq_len // (2 * ranks)
    return torch.cat([torch.arange(c * n, (c + 1) * n, device=device) for c in zigzag_chunks(rank, ranks)])


# -- one query chunk meets one key/value chunk ------------------------------------------------------------------


def _scores(q: Tensor, k: Tensor, scale: float, causal: bool) -> Tensor:
    s = scale * (q @ k.transpose(-2, -1))  # (B, H, n, n)
    if causal:  # the diagonal chunk: position i sees j <= i
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), -math.inf)
    return s


def attend_block(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool) -> tuple[Tensor, Tensor]:
    """The partial attention of query chunk q over one key/value chunk: (o (B, H, n, E), lse (B, H, n, 1))."""
    s = _scores(q, k, scale, causal)  # (B, H, n, n)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)  # (B, H, n, 1)
    return torch.exp(s - lse) @ v, lse


def merge(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor) -> tuple[Tensor, Tensor]:
    """Two partial softmaxes of one query chunk as one: each part weighted by its share of the summed exp."""
    new = torch.logaddexp(lse, block_lse)  # (B, H, n, 1)
    return torch.exp(lse - new) * out + torch.exp(block_lse - new) * block_out, new


def attend_block_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, lse: Tensor, delta: Tensor, scale: float, causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """One block's share of (dq, dk, dv), from the final ``lse`` and ``delta`` = rowsum(dout * out) of the query
    chunk: the scores recomputed, never stored."""
    p = torch.exp(_scores(q, k, scale, causal) - lse)  # (B, H, n, n) the final softmax's block (masked: 0)
    dv = p.transpose(-2, -1) @ dout  # (B, H, n, E)
    ds = p * (dout @ v.transpose(-2, -1) - delta)  # (B, H, n, n)
    return scale * (ds @ k), scale * (ds.transpose(-2, -1) @ q), dv


def meetings(rank: int, src: int, ranks: int) -> list[tuple[int, int, bool]]:
    """(query chunk slot, key chunk slot, causal) of each pair that meets when rank ``rank`` holds the key/value
    block of rank ``src``: key chunk b before query chunk a fully, b = a on the diagonal, none after."""
    mine, theirs = zigzag_chunks(rank, ranks), zigzag_chunks(src, ranks)
    return [(i, j, a == b) for i, a in enumerate(mine) for j, b in enumerate(theirs) if b <= a]


def halves(t: Tensor) -> tuple[Tensor, Tensor]:
    """A rank's (B, H, 2n, E) as its early and its late chunk."""
    n = t.shape[-2] // 2
    return t[..., :n, :], t[..., n:, :]


def forward_step(
    state: list[tuple[Tensor, Tensor] | None],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rank: int,
    src: int,
    ranks: int,
    scale: float,
) -> None:
    """Step of the ring: rank's queries meet the key/value block of rank ``src``; ``state`` [(o, lse) or None per
    query chunk] merged in place."""
    qs, ks, vs = halves(q), halves(k), halves(v)
    for i, j, causal in meetings(rank, src, ranks):
        o, lse = attend_block(qs[i], ks[j], vs[j], scale, causal)
        merged = state[i]
        state[i] = (o, lse) if merged is None else merge(*merged, o, lse)


def backward_step(
    dq: Tensor, dkv: Tensor, dout: Tensor, q: Tensor, k: Tensor, v: Tensor, lse: Tensor, delta: Tensor, rank: int,
    src: int, ranks: int, scale: float,
) -> None:  # fmt: skip
    """Step of the ring in backward: this rank's queries' share of the gradient of rank ``src``'s keys and values
    added into ``dkv`` (2, B, H, 2n, E), their own into ``dq``."""
    qs, ks, vs, dos, lses, deltas = halves(q), halves(k), halves(v), halves(dout), halves(lse), halves(delta)
    dqs, dks, dvs = halves(dq), halves(dkv[0]), halves(dkv[1])
    for i, j, causal in meetings(rank, src, ranks):
        g_q, g_k, g_v = attend_block_backward(dos[i], qs[i], ks[j], vs[j], lses[i], deltas[i], scale, causal)
        dqs[i].add_(g_q)
        dks[j].add_(g_k)
        dvs[j].add_(g_v)


# -- the ring ----------------------------------------------------------------------------------------------------


class Ring:
    """Point-to-point passes round a process group: each rank sends to the next and receives from the previous."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        glob = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))  # noqa: E731
        self.next, self.prev = glob((self.rank + 1) % self.size), glob((self.rank - 1) % self.size)

    def start(self, send: Tensor, tag: int = 0) -> tuple[list, Tensor]:
        """Send ``send`` on, receive its like from the previous rank: -> (the pending works, the receive buffer)."""
        recv = torch.empty_like(send)
        ops = [
            dist.P2POp(dist.isend, send, self.next, self.group, tag),
            dist.P2POp(dist.irecv, recv, self.prev, self.group, tag),
        ]
        return dist.batch_isend_irecv(ops), recv

    @staticmethod
    def finish(pending: tuple[list, Tensor]) -> Tensor:
        works, recv = pending
        for w in works:
            w.wait()
        return recv


class RingAttention(BaseLayer):
    """Causal attention of this rank's zigzag chunks against the whole sequence, over the ring ``group``.

    ``forward(q, k, v, is_causal=True, scale=None, keep_out=True)``: q, k, v (B, H, 2n, E) this rank's early
    and late chunk -> out (B, H, 2n, E); ``backward(dout, out=None)`` -> (dq, dk, dv), each the gradient of this
    rank's own q, k, v (the others' queries' shares of dk and dv brought home round the ring).  The call of
    ``ScaledDotProductAttention`` it stands in for (the GPT's, the tensor-parallel GPT's); masks and dropout are
    not taken (refused by name).  With ``seq_len``, the window's length T, the queries' 2n = T / C is checked."""

    class Saved(NamedTuple):
        q: Tensor  # (B, H, 2n, E)
        k: Tensor  # (B, H, 2n, E) this rank's own block, sent round the ring again in backward
        v: Tensor  # (B, H, 2n, E)
        out: Tensor | None  # (B, H, 2n, E); None with keep_out=False (the caller gives it back)
        lse: Tensor  # (B, H, 2n, 1) each row's log-sum-exp over the whole sequence
        scale: float

    def __init__(self, group: dist.ProcessGroup | None, seq_len: int | None = None) -> None:
        self.group, self.seq_len = group, seq_len  # seq_len: the whole window's length, checked against q's
        self.generator = None  # (the GPT's attention carries a dropout generator; dropout is refused here)

    def check_input(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None, *, keep_out=True):
        if attn_mask is not None or dropout_p or not is_causal:
            raise ValueError(
                f"RingAttention: causal attention without a mask or dropout only (attn_mask "
                f"{'given' if attn_mask is not None else None}, dropout_p {dropout_p}, is_causal {is_causal})"
            )
        if not (q.shape == k.shape == v.shape and q.dim() == 4 and q.shape[-2] % 2 == 0):
            raise ValueError(
                f"RingAttention: q, k, v must be (B, H, 2n, E) alike (two chunks), got {tuple(q.shape)}, "
                f"{tuple(k.shape)}, {tuple(v.shape)}"
            )
        if self.seq_len is not None and q.shape[-2] * dist.get_world_size(self.group) != self.seq_len:
            ranks = dist.get_world_size(self.group)
            raise ValueError(
                f"RingAttention: this rank's part of a window of {self.seq_len} over {ranks} ranks is "
                f"{self.seq_len // ranks} positions, got q with {q.shape[-2]} (its zigzag positions are those of "
                f"the whole window)"
            )

    def forward_math(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, scale=None, *, keep_out=True):
        ring = Ring(self.group)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        kv = torch.stack((k, v))  # (2, B, H, 2n, E) the block that travels
        state = [None, None]  # (o, lse) of the early and the late query chunk
        for step in range(ring.size):
            pending = ring.start(kv) if step < ring.size - 1 else None  # the next block on its way meanwhile
            forward_step(state, q, kv[0], kv[1], ring.rank, (ring.rank - step) % ring.size, ring.size, scale)
            if pending is not None:
                kv = Ring.finish(pending)
        out = torch.cat([state[0][0], state[1][0]], dim=-2)  # (B, H, 2n, E)
        lse = torch.cat([state[0][1], state[1][1]], dim=-2)  # (B, H, 2n, 1)
        return out, self.Saved(q, k, v, out if keep_out else None, lse, scale)

    def backward_math(
        self, dout: Tensor, saved: Saved, out: Tensor | None = None, into: tuple[Tensor, Tensor, Tensor] | None = None
    ):
        """dout (B, H, 2n, E) -> (dq, dk, dv); ``out`` and ``into`` as ScaledDotProductAttention's backward takes
        them (the forward's output, when not kept; three buffers the gradients are copied into and returned as)."""
        if into is not None:
            grads = self.backward_math(dout, saved, out)
            for buffer, d in zip(into, grads, strict=True):
                buffer.copy_(d)
            return into
        out = saved.out if out is None else out
        if out is None:
            raise ValueError("RingAttention.backward: the forward kept no output (keep_out=False): pass out=")
        ring = Ring(self.group)
        delta = (dout * out).sum(-1, keepdim=True)  # (B, H, 2n, 1) D = rowsum(dO * O)
        dq = torch.zeros_like(saved.q)
        kv = torch.stack((saved.k, saved.v))  # (2, B, H, 2n, E)
        dkv = torch.zeros_like(kv)  # the travelling block's gradient, added to by every rank it visits
        for step in range(ring.size):
            pending = ring.start(kv, tag=0) if step < ring.size - 1 else None
            src = (ring.rank - step) % ring.size
            backward_step(
                dq, dkv, dout, saved.q, kv[0], kv[1], saved.lse, delta, ring.rank, src, ring.size, saved.scale
            )
            if ring.size > 1:  # on to the next rank; the last pass brings ours home
                dkv = Ring.finish(ring.start(dkv, tag=1))
            if pending is not None:
                kv = Ring.finish(pending)
        return dq, dkv[0], dkv[1]


def simulate(q: Tensor, k: Tensor, v: Tensor, dout: Tensor, ranks: int, scale: float | None = None):
    """The ring run in one process, every rank's step s before any rank's step s+1: q, k, v, dout (B, H, T, E) the
    whole sequence -> (out, dq, dk, dv), the whole sequence's, in its order.  The same steps as ``RingAttention``,
    with the passes round the ring written as indexing (rank r holds rank (r - s) mod C's block at step s)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    pos = [zigzag_positions(q.shape[-2], r, ranks, q.device) for r in range(ranks)]
    part = lambda t, r: t[..., pos[r], :]  # noqa: E731  (rank r's two chunks)
    qs, ks, vs, dos = ([part(t, r) for r in range(ranks)] for t in (q, k, v, dout))
    states: list[list[Any]] = [[None, None] for _ in range(ranks)]  # (o, lse) per chunk, once forward_step ran
    for step in range(ranks):
        for r in range(ranks):
            src = (r - step) % ranks
            forward_step(states[r], qs[r], ks[src], vs[src], r, src, ranks, scale)
    outs = [torch.cat([s[0][0], s[1][0]], dim=-2) for s in states]
    lses = [torch.cat([s[0][1], s[1][1]], dim=-2) for s in states]
    deltas = [(dos[r] * outs[r]).sum(-1, keepdim=True) for r in range(ranks)]
    dqs = [torch.zeros_like(t) for t in qs]
    dkvs = [
        torch.zeros_like(torch.stack((k_, v_))) for k_, v_ in zip(ks, vs, strict=True)
    ]  # indexed by the block's owner
    for step in range(ranks):
        for r in range(ranks):
            src = (r - step) % ranks
            backward_step(dqs[r], dkvs[src], dos[r], qs[r], ks[src], vs[src], lses[r], deltas[r], r, src, ranks, scale)
    whole = lambda parts: torch.empty_like(q).index_copy_(-2, torch.cat(pos), torch.cat(parts, dim=-2))  # noqa: E731
    return whole(outs), whole(dqs), whole([d[0] for d in dkvs]), whole([d[1] for d in dkvs])
