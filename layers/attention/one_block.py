"""Attention when every key fits in one block (S <= block_size): each row's softmax computed whole.

The blocked path (``scaled_dot_product.py``) carries a running row maximum and row sum from one key block to
the next and rescales what it accumulated whenever the maximum grows.  With a single block there is nothing
to carry, so this is the same algorithm with the bookkeeping removed: one product for the scores, one
max / exp2 / sum over each row, one product with v, and the outputs written where they are computed (no
zero-filled accumulators, no copies into slices).  Shapes as in ``scaled_dot_product.py``: B flattened leading
axes, L queries, S keys, E query/key size, Ev value size.

Scores are kept in base 2 (both paths): exp(x) = 2^(x log2 e), the factor log2 e rides in the product's
alpha, and ``exp2`` is several times faster than ``exp`` on the CPU (measured, torch 2.14).

forward:   s   = scale log2(e) q @ k^T + masks                  (B, L, S)  base-2 scores
           m   = rowmax(s)   (0 for a row whose keys are all masked, so that 2^(-inf - 0) = 0, not nan)
           p   = 2^(s - m);   l = rowsum(p)                      (B, L, S), (B, L, 1)
           out = (p * dropout) @ v / l                           (B, L, Ev)
           lse = m + log2(l)   (+inf for an all-masked row)      (B, L, 1)  all that is kept besides q, k, v, out
           (with need_weights: A = p / l * dropout is formed first and out = A @ v)
backward:  P   = 2^(s - lse)                                    recomputed from lse, as FlashAttention does
           dv  = (P * dropout)^T @ dout                         (B, S, Ev)
           dP  = (dout @ v^T [+ dweights]) * dropout             (B, L, S)
           ds  = P * (dP - D),   D = rowsum(dout * out)          the softmax's backward
           dq  = scale ds @ k;   dk = scale ds^T @ q

The same numbers as the blocked path, up to rounding: ``tests/test_attention.py`` ties the two in float64
for every mask kind, dropout and need_weights (block sizes on both sides of S).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

LOG2E = 1.0 / math.log(2.0)  # log2(e): e^x = 2^(x log2 e)


def one_block_forward(q: Tensor, k: Tensor, v: Tensor, spec, *,
                      need_weights: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """q (B, L, E), k (B, S, E), v (B, S, Ev), ``spec`` (``scaled_dot_product._Spec``: masks, scale, dropout)
    -> (out (B, L, Ev), lse (B, L, 1) in base 2, weights A (B, L, S) or None)."""
    S = spec.S
    s = torch.baddbmm(q.new_zeros(1, 1, 1), q, k.transpose(1, 2), beta=0, alpha=spec.scale * LOG2E)  # (B, L, S)
    spec.mask_(s, 0, 0, S)
    may_empty = spec.blocked is not None or spec.bias is not None  # only explicit masks can hide a row's every key
    # The max only keeps exp2() in range; the result does not depend on it, so it is a constant to the gradient
    # (detached: gradcheck traces this forward with autograd, and the scores are then overwritten in place).
    m = s.detach().amax(-1, keepdim=True)  # (B, L, 1) row max, -inf for an all-masked row
    if may_empty:
        m.masked_fill_(m == -math.inf, 0.0)
    p = s.sub_(m).exp2_()  # (B, L, S) 2^(s - m), in the scores' memory
    l = p.sum(-1, keepdim=True)  # (B, L, 1)
    empty = None
    if may_empty:
        empty = l == 0  # rows whose keys are all masked: out = 0 (divided by 1), lse = +inf
        l.masked_fill_(empty, 1.0)
    weights = None
    # (p is not overwritten from here on: autograd, tracing this forward, needs exp2's result.)
    if need_weights:  # A = P * dropout, formed for the caller; out = A @ v
        weights = p / l  # (B, L, S) P
        if spec.seed is not None:
            weights = weights * spec.dropout(0, 0, S, weights)  # A
        out = torch.bmm(weights, v)  # (B, L, Ev)
    else:
        if spec.seed is not None:
            p = p * spec.dropout(0, 0, S, p)  # (B, L, S) the weights that survive dropout (l summed before)
        out = torch.bmm(p, v).div_(l)  # (B, L, Ev) normalised after the product: Ev values per row, not S
    lse = l.log2().add_(m)  # (B, L, 1) m + log2(l)
    if empty is not None:
        lse.masked_fill_(empty, math.inf)  # 2^(s - inf) = 0: the row's weights stay zero in backward
    return out, lse, weights


def one_block_backward(q: Tensor, k: Tensor, v: Tensor, do: Tensor, dw: Tensor | None, D: Tensor, lse: Tensor,
                       spec) -> tuple[Tensor, Tensor, Tensor]:
    """q (B, L, E), k (B, S, E), v (B, S, Ev), dout (B, L, Ev), dweights (B, L, S) or None, D = rowsum(dout *
    out) (B, L, 1) (+ rowsum(dweights * A)), lse (B, L, 1) base 2 -> (dq (B, L, E), dk (B, S, E), dv (B, S, Ev))."""
    S, scale = spec.S, spec.scale
    s = torch.baddbmm(-lse, q, k.transpose(1, 2), alpha=scale * LOG2E)  # (B, L, S) s - lse (lse broadcast)
    spec.mask_(s, 0, 0, S)  # (-inf - lse is -inf: masking after the shift is the same)
    p = s.exp2_()  # (B, L, S) P, in the scores' memory
    dp = torch.bmm(do, v.transpose(1, 2))  # (B, L, S) dA = dout @ v^T
    if dw is not None:
        dp.add_(dw)  # dA also receives the weights' own gradient
    if spec.seed is not None:
        mask = spec.dropout(0, 0, S, p)  # the forward's mask, regenerated
        dv = torch.bmm((p * mask).transpose(1, 2), do)  # (B, S, Ev) A^T @ dout
        dp.mul_(mask)  # dP = dA * mask
    else:
        dv = torch.bmm(p.transpose(1, 2), do)  # (B, S, Ev) P^T @ dout
    ds = dp.sub_(D).mul_(p)  # (B, L, S) P * (dP - D)
    zero = q.new_zeros(1, 1, 1)  # baddbmm's ignored addend (beta=0): the scale rides in alpha
    dq = torch.baddbmm(zero, ds, k, beta=0, alpha=scale)  # (B, L, E) scale * ds @ k
    dk = torch.baddbmm(zero, ds.transpose(1, 2), q, beta=0, alpha=scale)  # (B, S, E) scale * ds^T @ q
    return dq, dk, dv
