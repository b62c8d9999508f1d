"""A mixture-of-experts MLP by hand: a router's softmax picks top-k of K expert MLPs for each token, each expert
takes at most ``capacity`` tokens (the rest of its assignments are dropped and counted), and the auxiliary
load-balancing loss as Switch (k = 1) and Mixtral define it; forward and backward, the router's included.

Shape legend: N = tokens (every leading position), C = the width, H = an expert's hidden width, K = experts,
k = the experts a token is sent to, M = the tokens one expert takes.

Forward, for token n (x_n, (C,)):

    z = x_n Wr^T        p = softmax(z)            (K,)      the router
    e_1..e_k = the k largest p                              top-k, in order of p
    g_j = p_{e_j}  (or p_{e_j} / sum_i p_{e_i} with ``normalize``, Mixtral's)
    y_n = sum_j kept_j g_j E_{e_j}(x_n)      E_e(x) = W2_e gelu(W1_e x + b1_e) + b2_e

``kept_j`` is 0 for an assignment past its expert's capacity, ceil(capacity_factor k N / K) assignments: they are
queued first choices first, then second choices, each in token order (GShard's priority), so a token loses its
least wanted expert first; ``dropped`` counts them.  A dropped assignment adds nothing (the token passes through
the residual in a transformer).

The auxiliary loss (``aux_loss``), with f_e = (the times e is among a token's top k) / N and P_e = mean_n p_e:

    aux = K sum_e f_e P_e           (k when routing is uniform; Switch's with k = 1)

f is a count, without a gradient; the gradient flows through P.  ``backward(dy)`` returns the gradient of
sum(y * dy) + aux_coef * aux, the loss a trainer adds the auxiliary term to.

Backward: each expert's MLP backward on its M tokens (dW2 = dY^T a, da = dY W2, dh = da gelu'(h), dW1 = dh^T x,
dx += dh W1, with dY = g dy), the gates' gradient dg_j = dy . E_{e_j}(x) (0 when dropped), through the
normalisation (dp_i = (dg_i - sum_j dg_j g_j) / sum_j p_{e_j}), scattered to the chosen p, plus the auxiliary
loss's dP, through the softmax (dz = p * (dp - sum(dp * p))) and the router (dWr = dz^T x, dx += dz Wr).  The
choice of experts and the capacity are piecewise constant in x: they have no gradient.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .checks import check_int, check_number
from .layer import BaseLayer, learned
from .moe_twin import PytorchMoE


def check_moe(who: str, n_experts: int, top_k: int, capacity_factor: float, aux_coef: float) -> dict | None:
    """The mixture of experts' settings (None for n_experts 0, the dense MLP), refused in one line naming them."""
    check_int(who, "n_experts", n_experts, lo=0)
    if n_experts == 0:
        return None
    check_int(who, "top_k", top_k)
    if top_k > n_experts:
        raise ValueError(f"{who}: top_k {top_k} is more than n_experts {n_experts} (each token goes to top_k of them)")
    check_number(who, "capacity_factor", capacity_factor, 0.0, math.inf, lo_open=True)
    check_number(who, "aux_coef", aux_coef, 0.0, math.inf)
    return {
        "n_experts": n_experts,
        "top_k": top_k,
        "capacity_factor": float(capacity_factor),
        "aux_coef": float(aux_coef),
    }


def gelu_grad(h: Tensor) -> Tensor:
    """d gelu(h) / dh for the exact gelu(h) = h Phi(h): Phi(h) + h phi(h)."""
    cdf = 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))
    return cdf + h * torch.exp(-0.5 * h * h) / math.sqrt(2.0 * math.pi)


def route(probs: Tensor, top_k: int, capacity: int, normalize: bool):
    """probs (N, K) -> (experts (N, k), gates (N, k), chosen p (N, k), kept (N, k) bool): top-k, then each
    expert's first ``capacity`` assignments in priority order (all first choices, then all second, ...)."""
    top_p, experts = probs.topk(top_k, dim=-1)  # (N, k)
    gates = top_p / top_p.sum(-1, keepdim=True) if normalize else top_p
    order = experts.t().reshape(-1)  # (k N,) choice-major: the queue's order
    queue = torch.nn.functional.one_hot(order, probs.shape[-1]).cumsum(0)  # (k N, K) running count per expert
    place = queue.gather(1, order[:, None]).squeeze(1) - 1  # (k N,) the assignment's place in its expert's queue
    kept = (place < capacity).view(top_k, -1).t()  # (N, k)
    return experts, gates, top_p, kept


class MixtureOfExperts(BaseLayer):
    """K expert MLPs (C -> H -> C, exact GELU) behind a top-k softmax router, with capacity and the auxiliary
    load-balancing loss; see the module.  ``forward(x (*, C)) -> (*, C)``; after it, ``aux_loss`` (a scalar) and
    ``dropped`` (the assignments past capacity, an int) describe the routing.  Parameters as ``PytorchMoE``'s:
    ``router`` (K, C), ``w1`` (K, H, C), ``b1`` (K, H), ``w2`` (K, C, H), ``b2`` (K, C)."""

    _param_names = ("router", "w1", "b1", "w2", "b2")
    torch_class = PytorchMoE
    _ctor_args = ("n_embd", "n_hidden", "n_experts", "top_k", "capacity_factor", "normalize", "aux_coef")

    class Saved(NamedTuple):
        x: Tensor  # (N, C)
        probs: Tensor  # (N, K)
        experts: Tensor  # (N, k)
        gates: Tensor  # (N, k)
        top_p: Tensor  # (N, k)
        kept: Tensor  # (N, k)
        lead: torch.Size
        routes: list  # per expert: (tokens (M,), slots (M,), h (M, H), y (M, C))

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
        self.n_embd = check_int("MixtureOfExperts", "n_embd", n_embd)
        self.n_hidden = check_int("MixtureOfExperts", "n_hidden", n_hidden)
        self.n_experts = check_int("MixtureOfExperts", "n_experts", n_experts)
        self.top_k = check_int("MixtureOfExperts", "top_k", top_k)
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"MixtureOfExperts: top_k {top_k} must be between 1 and n_experts {n_experts}")
        if not capacity_factor > 0:
            raise ValueError(f"MixtureOfExperts: capacity_factor {capacity_factor} must be positive")
        self.capacity_factor, self.normalize, self.aux_coef = float(capacity_factor), bool(normalize), float(aux_coef)
        kw = {"device": device, "dtype": dtype}
        K, C, H = n_experts, n_embd, n_hidden
        u = lambda bound, *shape: (torch.rand(*shape, **kw) * 2 - 1) * bound  # noqa: E731  nn.Linear's uniform
        self.router, self.w1, self.b1, self.w2, self.b2 = learned(
            u(C**-0.5, K, C), u(C**-0.5, K, H, C), u(C**-0.5, K, H), u(H**-0.5, K, C, H), u(H**-0.5, K, C)
        )
        self.aux_loss: Tensor | None = None
        self.dropped = 0

    def extra_repr(self) -> str:
        return (
            f"n_embd={self.n_embd}, n_hidden={self.n_hidden}, n_experts={self.n_experts}, top_k={self.top_k}, "
            f"capacity_factor={self.capacity_factor}, normalize={self.normalize}, aux_coef={self.aux_coef}"
        )

    def capacity(self, tokens: int) -> int:
        """The assignments one expert takes: ceil(capacity_factor k N / K)."""
        return math.ceil(self.capacity_factor * self.top_k * tokens / self.n_experts)

    def check_input(self, x: object) -> None:
        if not (isinstance(x, Tensor) and x.is_floating_point() and x.dim() >= 1 and x.shape[-1] == self.n_embd):
            raise ValueError(
                f"MixtureOfExperts: x must be a floating (*, {self.n_embd}) tensor, got "
                f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}"
            )

    def forward_math(self, x: Tensor):
        """x (*, C) -> y (*, C)."""
        lead, xf = x.shape[:-1], x.reshape(-1, self.n_embd)  # (N, C)
        N, K = xf.shape[0], self.n_experts
        probs = torch.softmax(xf @ self.router.t(), dim=-1)  # (N, K)
        experts, gates, top_p, kept = route(probs, self.top_k, self.capacity(N), self.normalize)
        y = torch.zeros_like(xf)  # (N, C)
        routes = []
        for e in range(K):
            tokens, slots = ((experts == e) & kept).nonzero(as_tuple=True)  # (M,) each
            h = torch.addmm(self.b1[e], xf[tokens], self.w1[e].t())  # (M, H)
            ye = torch.addmm(self.b2[e], torch.nn.functional.gelu(h), self.w2[e].t())  # (M, C)
            y.index_add_(0, tokens, gates[tokens, slots, None] * ye)
            routes.append((tokens, slots, h, ye))
        counts = torch.zeros(K, dtype=xf.dtype, device=xf.device).index_add_(
            0, experts.reshape(-1), torch.ones(experts.numel(), dtype=xf.dtype, device=xf.device)
        )  # (K,) the times each expert is among a token's top k
        self.aux_loss = K * (counts / N * probs.mean(0)).sum()
        self.dropped = int((~kept).sum())
        return y.view(*lead, self.n_embd), self.Saved(xf, probs, experts, gates, top_p, kept, lead, routes)

    def backward_math(self, dy: Tensor, saved: Saved):
        """dy (*, C) -> dx (*, C), and every parameter's gradient of sum(y * dy) + aux_coef * aux."""
        x, probs, experts = saved.x, saved.probs, saved.experts  # (N, C), (N, K), (N, k)
        dy = dy.reshape(-1, self.n_embd)  # (N, C)
        N, K = x.shape[0], self.n_experts
        dx, dgates = torch.zeros_like(x), torch.zeros_like(saved.gates)  # (N, C), (N, k)
        dw1, db1, dw2, db2 = (torch.zeros_like(t) for t in (self.w1, self.b1, self.w2, self.b2))
        for e, (tokens, slots, h, ye) in enumerate(saved.routes):
            dyt = dy[tokens]  # (M, C)
            dgates[tokens, slots] = (dyt * ye).sum(-1)  # the gate scales the expert's output
            d = saved.gates[tokens, slots, None] * dyt  # (M, C) the expert's output gradient
            a = torch.nn.functional.gelu(h)  # (M, H) recomputed, not held
            dw2[e], db2[e] = d.t() @ a, d.sum(0)
            dh = (d @ self.w2[e]) * gelu_grad(h)  # (M, H)
            dw1[e], db1[e] = dh.t() @ x[tokens], dh.sum(0)
            dx.index_add_(0, tokens, dh @ self.w1[e])
        if self.normalize:  # g = p / s, s = the sum of the chosen p
            s = saved.top_p.sum(-1, keepdim=True)  # (N, 1)
            dtop = (dgates - (dgates * saved.gates).sum(-1, keepdim=True)) / s
        else:
            dtop = dgates
        dprobs = torch.zeros_like(probs).scatter_(1, experts, dtop)  # (N, K): a token's k experts are distinct
        counts = torch.zeros(K, dtype=x.dtype, device=x.device).index_add_(
            0, experts.reshape(-1), torch.ones(experts.numel(), dtype=x.dtype, device=x.device)
        )
        dprobs += self.aux_coef * K * (counts / N) / N  # d aux / d p_ne = K f_e / N
        dz = probs * (dprobs - (dprobs * probs).sum(-1, keepdim=True))  # (N, K) through the softmax
        dx += dz @ self.router
        grads = {"router": dz.t() @ x, "w1": dw1, "b1": db1, "w2": dw2, "b2": db2}
        return dx.view(*saved.lead, self.n_embd), grads
