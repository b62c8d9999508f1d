"""Expert parallelism by hand: the K experts of each mixture of experts (layers/moe.py) split over the E ranks of a
group, K / E a rank; each rank holds its own share of the batch's tokens (data parallelism), routes them with the
router every rank holds, sends each kept assignment to the rank of its expert, and gets the expert's output back.

Shape legend as layers/moe.py's; N_r = this rank's tokens, N = sum_r N_r the batch's, L = K / E the local experts,
S = the assignments this rank sends, R = those it receives.  Rank r holds experts [r L, (r + 1) L).

Forward, on rank r:

    p = softmax(x Wr^T)                (N_r, K)   top-k e_nj, gates g_nj, as one process
    kept                                         one process's capacity over the batch: an assignment's place in
                                                 its expert's queue (choice-major, tokens in rank order) counts
                                                 every rank's earlier ones, from the ranks' (k, K) counts gathered
    dispatch:  xs = x[n_i]  (S, C), in the order of (expert, token); all_to_all_single(xs, splits by rank)
    experts:   ye_i = E_{e_i}(xr_i)   (R, C) for each received row, by the local expert it was sent to
    combine:   all_to_all_single back, the splits swapped: ys (S, C) in the order sent;  y[n_i] += g_i ys_i
    aux:       K sum_e f_e P_e with f from the gathered counts; this rank's share: K sum_e f_e sum_{n on r} p_ne / N

Backward: an all-to-all is a permutation of rows between ranks, so its gradient is the inverse permutation: the
all-to-all with the splits swapped.  dys_i = g_i dy[n_i] goes to the expert's rank as ys came (the combine's
reverse: the dispatch's splits), the expert's backward gives dW1, db1, dW2, db2 there (every rank's tokens'
share: complete on the rank holding the expert) and dxr, which comes back as xr went (the dispatch's reverse: the
combine's splits) and is scatter-added at the tokens.  The gates' gradient dg_i = dy[n_i] . ys_i, the auxiliary
loss's d aux / d p_ne = K f_e / N, the softmax and the router, as one process, on the rank's own tokens; the router's
gradient sums over the ranks in the data-parallel reduction.  ``grad_scale`` (the reduction's averaging factor, the
number of ranks) multiplies the auxiliary term, as the trainer's loss gradient is multiplied.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from layers.layer import BaseLayer
from layers.moe import MixtureOfExperts, gelu_grad

from .pipeline_gpt import replicate


def all_to_all(rows: Tensor, send: list[int], recv: list[int], group) -> Tensor:
    """Rows (sum(send), *) -> (sum(recv), *): send[q] rows to rank q, recv[q] from it, in rank order."""
    out = rows.new_empty(sum(recv), *rows.shape[1:])
    dist.all_to_all_single(out, rows.contiguous(), recv, send, group=group)
    return out


class ExpertParallelMoE(BaseLayer):
    """Rank ``rank`` of ``size``'s part of ``moe``: the router (the same tensor), and experts [rank L, (rank + 1) L)
    as its own tensors (copies of the slices); see the module.  ``forward(x (*, C)) -> (*, C)``; ``aux_loss`` is
    this rank's share (they sum over the ranks to the batch's), ``dropped`` the batch's count."""

    _param_names = ("router", "w1", "b1", "w2", "b2")

    class Saved(NamedTuple):
        x: Tensor  # (N_r, C)
        probs: Tensor  # (N_r, K)
        experts: Tensor  # (N_r, k)
        gates: Tensor  # (N_r, k)
        tokens: Tensor  # (S,) the token of each assignment sent
        slots: Tensor  # (S,) its choice j
        ys: Tensor  # (S, C) the experts' outputs, back
        send: list  # rows sent to each rank
        recv: list  # rows received from each rank
        local: Tensor  # (R,) the local expert of each row received
        xr: Tensor  # (R, C) the rows received
        h: Tensor  # (R, H) their hidden pre-activations
        counts: Tensor  # (K,) the times each expert is among a token's top k, over the batch
        n: int  # N, the batch's tokens
        lead: torch.Size

    def __init__(self, moe: MixtureOfExperts, group, rank: int, size: int, grad_scale: float = 1.0) -> None:
        K = moe.n_experts
        if K % size:
            raise ValueError(f"ExpertParallelMoE: n_experts {K} does not divide by the expert-parallel size {size}")
        L = K // size
        lo = rank * L
        self.router = moe.router
        self.w1, self.b1, self.w2, self.b2 = (
            t.detach()[lo : lo + L].clone().requires_grad_(t.requires_grad) for t in (moe.w1, moe.b1, moe.w2, moe.b2)
        )
        self.n_embd, self.n_experts, self.top_k = moe.n_embd, K, moe.top_k
        self.capacity_factor, self.normalize, self.aux_coef = moe.capacity_factor, moe.normalize, moe.aux_coef
        self.group, self.rank, self.size, self.local_experts = group, rank, size, L
        self.grad_scale = grad_scale
        self.aux_loss: Tensor | None = None
        self.dropped = 0

    def extra_repr(self) -> str:
        return f"n_experts={self.n_experts}, experts {self.rank * self.local_experts}.. on rank {self.rank}/{self.size}"

    def kept(self, experts: Tensor) -> tuple[Tensor, Tensor, int, int]:
        """experts (N_r, k) -> (kept (N_r, k) bool, counts (K,) over the batch, N, the batch's dropped count): one
        process's capacity, from one all-gather of every rank's (k, K) counts."""
        k, K = self.top_k, self.n_experts
        mine = F.one_hot(experts.t(), K).sum(1)  # (k, K) this rank's assignments by choice and expert
        every = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(every, mine.contiguous(), group=self.group)
        counts = torch.stack(every)  # (E, k, K)
        N = int(counts[:, 0].sum())  # every token has one first choice
        capacity = math.ceil(self.capacity_factor * k * N / K)
        # the places before this rank's choice-j assignments to e: every rank's earlier choices, then the earlier
        # ranks' choice j
        earlier = counts.sum(0).cumsum(0) - counts.sum(0) + counts[: self.rank].sum(0)  # (k, K)
        order = experts.t()  # (k, N_r)
        queue = F.one_hot(order, K).cumsum(1)  # (k, N_r, K) the running count within this rank's choice j
        place = queue.gather(2, order[..., None]).squeeze(2) - 1 + earlier.gather(1, order)  # (k, N_r)
        per_expert = counts.sum((0, 1))  # (K,) an expert keeps the first ``capacity`` of its queue
        return (place < capacity).t(), per_expert, N, int((per_expert - capacity).clamp(min=0).sum())

    def forward_math(self, x: Tensor):
        lead, xf = x.shape[:-1], x.reshape(-1, self.n_embd)  # (N_r, C)
        K, L = self.n_experts, self.local_experts
        probs = torch.softmax(xf @ self.router.t(), dim=-1)  # (N_r, K)
        top_p, experts = probs.topk(self.top_k, dim=-1)  # (N_r, k)
        gates = top_p / top_p.sum(-1, keepdim=True) if self.normalize else top_p
        kept, counts, N, self.dropped = self.kept(experts)
        # dispatch: the kept assignments in the order of their experts, then of their tokens
        tokens, slots = kept.nonzero(as_tuple=True)  # (S,) each, in token order
        chosen = experts[tokens, slots]  # (S,)
        by_expert = torch.sort(chosen, stable=True).indices
        tokens, slots, chosen = tokens[by_expert], slots[by_expert], chosen[by_expert]
        send = torch.bincount(chosen // L, minlength=self.size)  # (E,) rows for each rank
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        send_l, recv_l = send.tolist(), recv.tolist()
        xr = all_to_all(xf[tokens], send_l, recv_l, self.group)  # (R, C)
        local = all_to_all((chosen % L)[:, None], send_l, recv_l, self.group)[:, 0]  # (R,)
        # the local experts on the rows they were sent
        h = xr.new_empty(xr.shape[0], self.w1.shape[1])  # (R, H)
        ye = torch.empty_like(xr)  # (R, C)
        for e in range(L):
            rows = (local == e).nonzero(as_tuple=True)[0]
            h[rows] = torch.addmm(self.b1[e], xr[rows], self.w1[e].t())
            ye[rows] = torch.addmm(self.b2[e], F.gelu(h[rows]), self.w2[e].t())
        ys = all_to_all(ye, recv_l, send_l, self.group)  # (S, C) combine: back where they came from
        y = torch.zeros_like(xf).index_add_(0, tokens, gates[tokens, slots, None] * ys)
        f = counts.to(xf.dtype) / N  # (K,)
        self.aux_loss = K * (f * probs.sum(0) / N).sum()  # this rank's share of K sum_e f_e P_e
        saved = self.Saved(xf, probs, experts, gates, tokens, slots, ys, send_l, recv_l, local, xr, h, counts, N, lead)
        return y.view(*lead, self.n_embd), saved

    def backward_math(self, dy: Tensor, saved: Saved):
        x, probs, experts = saved.x, saved.probs, saved.experts
        dy = dy.reshape(-1, self.n_embd)  # (N_r, C)
        K, L = self.n_experts, self.local_experts
        dyt = dy[saved.tokens]  # (S, C)
        dgates = torch.zeros_like(saved.gates)
        dgates[saved.tokens, saved.slots] = (dyt * saved.ys).sum(-1)  # the gate scales the expert's output
        d_ys = saved.gates[saved.tokens, saved.slots, None] * dyt  # (S, C)
        d_ye = all_to_all(d_ys, saved.send, saved.recv, self.group)  # (R, C) the combine's reverse
        d_xr = torch.empty_like(saved.xr)  # (R, C)
        dw1, db1, dw2, db2 = (torch.zeros_like(t) for t in (self.w1, self.b1, self.w2, self.b2))
        for e in range(L):
            rows = (saved.local == e).nonzero(as_tuple=True)[0]
            h, d = saved.h[rows], d_ye[rows]  # (M, H), (M, C)
            dw2[e], db2[e] = d.t() @ F.gelu(h), d.sum(0)
            dh = (d @ self.w2[e]) * gelu_grad(h)  # (M, H)
            dw1[e], db1[e] = dh.t() @ saved.xr[rows], dh.sum(0)
            d_xr[rows] = dh @ self.w1[e]
        d_xs = all_to_all(d_xr, saved.recv, saved.send, self.group)  # (S, C) the dispatch's reverse
        dx = torch.zeros_like(x).index_add_(0, saved.tokens, d_xs)
        if self.normalize:  # g = p / s, s = the sum of the chosen p
            s = probs.gather(1, experts).sum(-1, keepdim=True)  # (N_r, 1)
            dtop = (dgates - (dgates * saved.gates).sum(-1, keepdim=True)) / s
        else:
            dtop = dgates
        dprobs = torch.zeros_like(probs).scatter_(1, experts, dtop)  # (N_r, K)
        f = saved.counts.to(x.dtype) / saved.n  # (K,) the batch's
        dprobs += self.grad_scale * self.aux_coef * K * f / saved.n  # d aux / d p_ne = K f_e / N
        dz = probs * (dprobs - (dprobs * probs).sum(-1, keepdim=True))  # (N_r, K) through the softmax
        dx += dz @ self.router
        # the experts' gradients are whole here, of every rank's tokens; the loss gradient came multiplied by the
        # reduction's averaging factor, which they, not averaged, divide out
        experts_grads = {n: g / self.grad_scale for n, g in (("w1", dw1), ("b1", db1), ("w2", dw2), ("b2", db2))}
        return dx.view(*saved.lead, self.n_embd), {"router": dz.t() @ x, **experts_grads}


EXPERT_PARAMS = ("w1", "b1", "w2", "b2")


def expert_parallel(gpt, group, rank: int, size: int, grad_scale: float):
    """A copy of the GPT's layer tree (the same tensors) whose mixtures of experts hold rank ``rank``'s experts of
    ``size``, dispatching over ``group``; see the module."""
    copy = replicate(gpt)
    for block in copy.h:
        block.mlp = ExpertParallelMoE(block.mlp, group, rank, size, grad_scale)
    return copy


def is_expert_param(name: str) -> bool:
    """Whether a GPT parameter (by name) is an expert's: split over the ranks, not replicated."""
    return ".mlp." in name and name.rsplit(".", 1)[-1] in EXPERT_PARAMS
