"""PytorchMoE: the nn.Module twin of ``layers.moe.MixtureOfExperts``, written another way and differentiated by
autograd: every expert runs on every token (dense), a combine matrix (N, K) holds each token's gate for each expert
it keeps (0 elsewhere), and the capacity is counted in a plain loop over the queue.  The same parameters by name and
shape, so the two load each other's state_dict."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class PytorchMoE(nn.Module):
    def __init__(
        self,
        n_embd: int,
        n_hidden: int,
        n_experts: int,
        top_k: int = 2,
        capacity_factor: float = 1.25,
        normalize: bool = False,
        aux_coef: float = 0.01,
        *,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        K, C, H = n_experts, n_embd, n_hidden
        self.router = nn.Parameter(torch.empty(K, C, **kw))
        self.w1, self.b1 = nn.Parameter(torch.empty(K, H, C, **kw)), nn.Parameter(torch.empty(K, H, **kw))
        self.w2, self.b2 = nn.Parameter(torch.empty(K, C, H, **kw)), nn.Parameter(torch.empty(K, C, **kw))
        for p, fan_in in ((self.router, C), (self.w1, C), (self.b1, C), (self.w2, H), (self.b2, H)):
            nn.init.uniform_(p, -(fan_in**-0.5), fan_in**-0.5)
        self.n_embd, self.n_hidden, self.n_experts, self.top_k = n_embd, n_hidden, n_experts, top_k
        self.capacity_factor, self.normalize, self.aux_coef = capacity_factor, normalize, aux_coef
        self.aux_loss: Tensor | None = None
        self.dropped = 0

    def forward(self, x: Tensor) -> Tensor:
        xf = x.reshape(-1, self.n_embd)  # (N, C)
        N, K, k = xf.shape[0], self.n_experts, self.top_k
        probs = F.softmax(xf @ self.router.t(), dim=-1)  # (N, K)
        top_p, experts = probs.topk(k, dim=-1)  # (N, k)
        gates = top_p / top_p.sum(-1, keepdim=True) if self.normalize else top_p
        capacity, taken = math.ceil(self.capacity_factor * k * N / K), [0] * K
        combine = torch.zeros_like(probs)  # (N, K)
        for j in range(k):  # first choices first, each in token order
            for n in range(N):
                e = int(experts[n, j])
                if taken[e] < capacity:
                    taken[e] += 1
                    combine = combine.index_put((torch.tensor(n), torch.tensor(e)), gates[n, j])
        self.dropped = k * N - sum(taken)
        h = torch.einsum("nc,ehc->neh", xf, self.w1) + self.b1  # (N, K, H) every expert on every token
        out = torch.einsum("neh,ech->nec", F.gelu(h), self.w2) + self.b2  # (N, K, C)
        y = torch.einsum("ne,nec->nc", combine, out)
        f = F.one_hot(experts, K).sum((0, 1)).to(probs.dtype) / N  # (K,)
        self.aux_loss = K * (f * probs.mean(0)).sum()
        return y.view_as(x)
