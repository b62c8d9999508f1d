"""Attention FlashAttention's way: keys in blocks, an online softmax, no (L, S) matrix kept.

Shape legend (torch's F.scaled_dot_product_attention): B = the leading batch/head axes flattened (the C++ kernel
also takes them as two, B and H = heads: ``forward``), L = query length, S = key/value length, E = query/key size,
Ev = value size, Bc = keys per block (``Spec.block``).

layers/attention/scaled_dot_product.py writes attention's textbook: the (L, S) scores and probabilities kept,
their backward through the softmax's Jacobian, ``dS = P * (dP - rowsum(dP * P))``.  Here the same numbers while
holding at most one (L, Bc) block of scores at a time (Dao et al., FlashAttention, 2022, Algorithms 1 and 2, here
vectorised over all query rows and looping over key blocks):

forward, for each key block j, with a running row maximum m and running row sum l (the online softmax):
    s    = scale * q @ k_j^T + bias_j                   (L, Bc)
    m'   = max(m, rowmax(s));   p = exp(s - m')          (L, Bc) unnormalised probabilities
    l    = l * exp(m - m') + rowsum(p)                   rescale what was summed against the old max
    acc  = acc * exp(m - m') + (p * dropout_j) @ v_j     (L, Ev)
then out = acc / l, and only out and each row's log-sum-exp, lse = m + log(l), are kept for backward.

backward recomputes each block's probabilities from lse instead of storing them, p = exp(s - lse), and
replaces rowsum(dP * P) -- which would need the whole row -- by D = rowsum(dout * out), the same number
(sum_s dP_s P_s = sum_s (dout . v_s) A_s = dout . out):
    dv_j  = (p * dropout_j)^T @ dout                     dp = (dout @ v_j^T) * dropout_j
    ds    = p * (dp - D)                                 (L, Bc)
    dq   += scale * ds @ k_j;   dk_j = scale * ds^T @ q

With ``is_causal`` key block j is computed only for the query rows l >= its first key, so a causal pass does about
half the work.  A row whose keys are all masked gives zeros and zero gradients.  The block size changes nothing but
rounding.  Both passes compute in base 2: the scores carry a factor log2 e (in the product's alpha), exp becomes
exp2 and lse is a base-2 log-sum-exp -- the same numbers, and exp2 is faster on the CPU (docs/benchmarks.md).

When every key fits in one block (S <= Bc) the same algorithm runs without the online softmax's running state
(``one_block_forward``/``one_block_backward``): one product for the scores, one max / exp2 / sum over each row, one
product with v, and the outputs written where they are computed (no zero-filled accumulators, no copies into
slices):

forward:   s   = scale log2(e) q @ k^T + masks                  (B, L, S)  base-2 scores
           m   = rowmax(s)   (0 for a row whose keys are all masked, so that 2^(-inf - 0) = 0, not nan)
           p   = 2^(s - m);   l = rowsum(p)                      (B, L, S), (B, L, 1)
           out = (p * dropout) @ v / l                           (B, L, Ev)
           lse = m + log2(l)   (+inf for an all-masked row)      (B, L, 1)  all that is kept besides q, k, v, out
backward:  P   = 2^(s - lse);  dv = (P * dropout)^T @ dout;  dP = (dout @ v^T [+ dweights]) * dropout
           ds  = P * (dP - D);  dq = scale ds @ k;  dk = scale ds^T @ q
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from . import cpp

LOG2E = 1.0 / math.log(2.0)  # log2(e): e^x = 2^(x log2 e)


def forward(q: Tensor, k: Tensor, v: Tensor, spec: Spec, *, need_weights: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """q (B, L, E), k (B, S, E), v (B, S, Ev) -> (out (B, L, Ev), lse (B, L, 1) in base 2, weights (B, L, S) or
    None): one block where every key fits in one, else the key blocks with the online softmax; in C++ where no
    mask, bias, dropout or weights are asked for (kernels/cpp/attention.cpp: the same key blocks against blocks of
    query rows).  q, k, v may also be (B, H, L, E), ... (the heads apart, as ``runs_cpp`` allows them): out and lse
    are then (B, H, L, Ev) and (B, H, L, 1), out the C++ kernel's (the heads side by side in memory where q's are)."""
    if runs_cpp(spec, q, k, v, need_weights=need_weights):
        # (q, k, v as they come: the kernel reads any layout whose rows are contiguous, a head's view of a wider
        # projection included)
        out, lse = cpp.ops.attention_forward(_rows(q), _rows(k), _rows(v), *_cpp_args(spec))
        return out, lse, None
    if q.dim() == 4:  # the eager kernels take the (batch, head) pairs as one axis
        out, lse, weights = forward(_flat(q), _flat(k), _flat(v), spec, need_weights=need_weights)
        return out.view(*q.shape[:-1], -1), lse.view(*q.shape[:-1], 1), weights
    if spec.block >= spec.S:
        return one_block_forward(q, k, v, spec, need_weights=need_weights)
    return blocked_forward(q, k, v, spec, need_weights=need_weights)


def backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    do: Tensor,
    dw: Tensor | None,
    D: Tensor,
    lse: Tensor,
    spec: Spec,
    into: tuple[Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v, dout (B, L, Ev), dweights (B, L, S) or None, D = rowsum(dout * out) (B, L, 1) (+ rowsum(dweights *
    A)), lse (B, L, 1) in base 2 -> (dq, dk, dv) shaped as q, k, v (with (B, H, L, E) inputs, (B, H, L, 1) D and
    lse, and no dweights: from C++ laid out as the forward's out).  ``into``: three
    tensors shaped as q, k, v, of their dtype: where the C++ kernel runs and their rows are contiguous and apart (the
    GPT's views of c_attn's output gradient), it writes the gradients into them and returns ``into`` itself; else
    the gradients come back as new tensors, for the caller to copy."""
    if dw is None and _plain(spec) and cpp.usable(q, k, v, do, D, lse, *(into or ())):
        qkv = (_rows(q), _rows(k), _rows(v), _rows(do))
        args = (D.contiguous(), lse.contiguous(), *_cpp_args(spec))
        if into is not None and all(t.stride(-1) == 1 and t.stride(-2) >= t.shape[-1] for t in into):
            cpp.ops.attention_backward_into(*qkv, *args, *into)
            return into
        return cpp.ops.attention_backward(*qkv, *args)
    if q.dim() == 4:  # the eager kernels take the (batch, head) pairs as one axis
        dq, dk, dv = backward(_flat(q), _flat(k), _flat(v), _flat(do), dw, _flat(D), _flat(lse), spec)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)
    if spec.block >= spec.S:
        return one_block_backward(q, k, v, do, dw, D, lse, spec)
    return blocked_backward(q, k, v, do, dw, D, lse, spec)


def runs_cpp(spec: Spec, q: Tensor, k: Tensor, v: Tensor, *, need_weights: bool) -> bool:
    """Whether ``forward`` runs the C++ kernel on q, k, v: no weights asked for, no mask, bias or dropout, and the
    C++ kernels usable on them (kernels/cpp/__init__.py) -- then q, k, v may keep their heads apart, (B, H, L, E)."""
    return not need_weights and _plain(spec) and cpp.usable(q, k, v)


def _plain(spec: Spec) -> bool:
    """No mask, bias or dropout (causal or not): what the C++ kernel computes."""
    return spec.blocked is None and spec.bias is None and spec.drop is None


def _rows(t: Tensor) -> Tensor:
    """t (B, [H,] rows, cols) itself where its rows are contiguous (all the C++ kernel needs), else a contiguous
    copy."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _flat(t: Tensor) -> Tensor:
    """t (B, H, rows, cols) -> (B H, rows, cols): a view where its layout allows, else a copy."""
    return t.reshape(-1, *t.shape[-2:])


def _cpp_args(spec: Spec) -> tuple[float, bool, int]:
    """(scale, causal, keys per block) for the C++ operators: a block no wider than the keys, at least one."""
    return spec.scale, spec.causal, max(1, min(spec.block, spec.S))


def row_dot(do: Tensor, out: Tensor) -> Tensor:
    """D = rowsum(dout * out) (B, [H,] L, 1) for dout and out (B, [H,] L, Ev): one dot product per row, no
    (B, L, Ev) temporary.  (B, H, L, Ev) dout and out that are not contiguous but hold their heads side by side in
    memory ((B, L, H, Ev) contiguous: the GPT's, and the C++ forward's out) are read in that order, no copy."""
    if do.dim() == 4 and not (do.is_contiguous() and out.is_contiguous()):
        dt, ot = do.transpose(1, 2), out.transpose(1, 2)  # (B, L, H, Ev)
        if dt.is_contiguous() and ot.is_contiguous():
            return _row_dot(dt, ot).transpose(1, 2).contiguous()  # (B, H, L, 1), as the C++ backward takes D
    return _row_dot(do, out)


def _row_dot(do: Tensor, out: Tensor) -> Tensor:
    """rowsum(dout * out) (*, 1) for dout and out (*, Ev), as one batched product of (1, Ev) and (Ev, 1)."""
    Ev = do.shape[-1]
    return torch.bmm(do.reshape(-1, 1, Ev), out.reshape(-1, Ev, 1)).view(*do.shape[:-1], 1)


class Spec:
    """What a forward decided, for its blocks and for the backward that recomputes them: the sizes, scale,
    masks (``blocked``: True where a query may NOT attend; ``bias``: added to the scores), causality, the dropout
    (``drop(row_range, col_range, dtype, device)`` -> a block's scaled mask, or None: no dropout) and keys per block.
    """

    __slots__ = ("lead", "L", "S", "scale", "blocked", "bias", "causal", "drop", "block")

    def __init__(self, *, lead, L, S, scale, blocked, bias, causal, drop, block) -> None:
        self.lead, self.L, self.S, self.scale = lead, L, S, scale
        self.blocked, self.bias, self.causal, self.drop, self.block = blocked, bias, causal, drop, block

    def blocks(self):
        """(first key, end key, first query row) of every key block that some query row may see."""
        for j0 in range(0, self.S, self.block):
            r0 = j0 if self.causal else 0  # causal: query rows before the block's first key see none of it
            if r0 >= self.L:
                return
            yield j0, min(j0 + self.block, self.S), r0

    def mask_(self, s: Tensor, r0: int, j0: int, j1: int) -> None:
        """Apply the masks to the base-2 scores s (B, Lr, Bc) of rows r0.. and keys j0..j1, in place (a float
        mask, added to the natural-log scores, is added times log2 e)."""
        if self.blocked is not None or self.bias is not None:
            view = s.view(*self.lead, s.shape[1], s.shape[2])  # (*, Lr, Bc): the masks broadcast over *
            if self.blocked is not None:
                view.masked_fill_(_block(self.blocked, r0, j0, j1), -math.inf)
            if self.bias is not None:
                view.add_(_block(self.bias, r0, j0, j1), alpha=LOG2E)
        if self.causal and j1 - 1 > r0:  # some key in the block lies after some row: mask key s > row l
            r1 = min(j1 - 1, self.L)  # rows from j1 - 1 on see every key of the block: only the corner is masked
            # (while torch.compile traces, the graph makes its own corner: the cache is plain Python)
            bias = _causal_bias.__wrapped__ if torch.compiler.is_compiling() else _causal_bias
            s[:, : r1 - r0].add_(bias(r0, r1, j0, j1, s.dtype, s.device))  # -inf where key > row

    def dropout(self, r0: int, j0: int, j1: int, like: Tensor) -> Tensor:
        """The scaled dropout mask of rows r0.. and keys j0..j1, (B, Lr, Bc)."""
        return self.drop((r0, self.L), (j0, j1), like.dtype, like.device)


def blocked_forward(
    q: Tensor, k: Tensor, v: Tensor, spec: Spec, *, need_weights: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """q (B, L, E), k (B, S, E), v (B, S, Ev) -> (out (B, L, Ev), lse (B, L, 1) in base 2, weights (B, L, S) or
    None): the key blocks one after another with the online softmax (the module docstring's forward)."""
    B, L, S, Ev = q.shape[0], spec.L, spec.S, v.shape[2]
    cdt, scale, drop = q.dtype, spec.scale * LOG2E, spec.drop  # base-2 scores: exp(x) = 2^(x log2 e)
    zero = q.new_zeros(1, 1, 1)  # baddbmm's addend, ignored (beta=0): the scale rides in its alpha, no scaled copy of q
    kt = k.transpose(1, 2)  # (B, E, S)
    # The running state of the live query rows (rows a later key block can still reach): row max m,
    # row sum l of exp(s - m), and acc = sum of p @ v.  A causal pass finishes rows as it goes (block j
    # starts at key j0 and reaches only rows >= j0): their state moves to `done`, nothing is copied.
    m = torch.full((B, L, 1), -math.inf, dtype=cdt, device=q.device)  # (B, L, 1)
    l = torch.zeros((B, L, 1), dtype=cdt, device=q.device)  # (B, L, 1)
    acc = torch.zeros((B, L, Ev), dtype=cdt, device=q.device)  # (B, L, Ev)
    done: list[tuple[Tensor, Tensor, Tensor]] = []
    row = 0  # the first live row
    for j0, j1, r0 in spec.blocks():
        if r0 > row:  # rows row..r0 are finished
            done.append((m[:, : r0 - row], l[:, : r0 - row], acc[:, : r0 - row]))
            m, l, acc, row = m[:, r0 - row :], l[:, r0 - row :], acc[:, r0 - row :], r0
        s = torch.baddbmm(zero, q[:, r0:], kt[:, :, j0:j1], beta=0, alpha=scale)  # (B, Lr, Bc) rows r0.., keys j0..j1
        spec.mask_(s, r0, j0, j1)
        # The max only keeps exp() in range: the result does not depend on it, so it is a constant to
        # the gradient (detached: autograd, when it traces this forward, gives the same derivative).
        m_new = torch.maximum(m, s.detach().amax(-1, keepdim=True))  # (B, Lr, 1), -inf: row masked so far
        m_exp = m_new.masked_fill(m_new == -math.inf, 0.0)  # such a row: exp(-inf - 0) = 0, not nan
        p = s.sub_(m_exp).exp2_()  # (B, Lr, Bc) 2^(s - m'), in the scores' memory
        corr = (m - m_exp).exp2_()  # (B, Lr, 1) rescales what was summed against the old maximum
        l = torch.addcmul(p.sum(-1, keepdim=True), l, corr)  # (B, Lr, 1)
        if drop is not None:
            p = p * spec.dropout(r0, j0, j1, p)  # (B, Lr, Bc) the weights that survive dropout
        acc = torch.baddbmm(acc * corr, p, v[:, j0:j1])  # (B, Lr, Ev) acc * corr + p @ v_j
        m = m_new
    if done:
        m, l, acc = (
            torch.cat([*parts, last], 1) for parts, last in zip(zip(*done, strict=True), (m, l, acc), strict=True)
        )
    empty = l == 0  # rows whose keys are all masked
    out = acc.div_(l.masked_fill(empty, 1.0))  # (B, L, Ev): zeros where every key was masked (acc's memory)
    lse = (m + l.log2()).masked_fill_(empty, math.inf)  # (B, L, 1); +inf makes 2^(s - lse) = 0 there
    weights = None
    if need_weights:  # one dense pass, for a caller who asked to see the (L, S) weights
        s = torch.baddbmm(zero, q, kt, beta=0, alpha=scale)  # (B, L, S)
        spec.mask_(s, 0, 0, S)
        weights = s.sub_(lse).exp2_()  # (B, L, S) P
        if drop is not None:
            weights = weights * spec.dropout(0, 0, S, weights)  # A = P * mask
    return out, lse, weights


def blocked_backward(
    q: Tensor, k: Tensor, v: Tensor, do: Tensor, dw: Tensor | None, D: Tensor, lse: Tensor, spec: Spec
) -> tuple[Tensor, Tensor, Tensor]:
    """The module docstring's backward, key block by key block: q (B, L, E), k (B, S, E), v (B, S, Ev), dout
    (B, L, Ev), dweights (B, L, S) or None, D = rowsum(dout * out) (B, L, 1), lse (B, L, 1) in base 2
    -> (dq, dk, dv) shaped as q, k, v."""
    scale, scale2 = spec.scale, spec.scale * LOG2E
    kt = k.transpose(1, 2)  # (B, E, S)
    dq = torch.zeros_like(q)  # (B, L, E)
    dk = torch.zeros_like(k)  # (B, S, E) (a key block no query row sees keeps zeros)
    dv = torch.zeros_like(v)  # (B, S, Ev)
    for j0, j1, r0 in spec.blocks():
        s = torch.baddbmm(-lse[:, r0:], q[:, r0:], kt[:, :, j0:j1], alpha=scale2)  # (B, Lr, Bc) scores - lse
        spec.mask_(s, r0, j0, j1)  # (-inf - lse is -inf: masking after the shift is the same)
        p = s.exp2_()  # (B, Lr, Bc) P, recomputed from the kept log-sum-exp
        dp = torch.bmm(do[:, r0:], v[:, j0:j1].transpose(1, 2))  # (B, Lr, Bc) dA = dout @ v_j^T
        if dw is not None:
            dp.add_(dw[:, r0:, j0:j1])  # dA also receives the weights' gradient
        if spec.drop is not None:
            mask = spec.dropout(r0, j0, j1, p)  # the forward's mask, regenerated
            dv[:, j0:j1] = torch.bmm((p * mask).transpose(1, 2), do[:, r0:])  # (B, Bc, Ev) A_j^T @ dout
            dp.mul_(mask)  # dP = dA * mask
        else:
            dv[:, j0:j1] = torch.bmm(p.transpose(1, 2), do[:, r0:])  # (B, Bc, Ev) P_j^T @ dout
        ds = dp.sub_(D[:, r0:]).mul_(p)  # (B, Lr, Bc) P * (dP - D): the softmax's backward
        dq[:, r0:].baddbmm_(ds, k[:, j0:j1], alpha=scale)  # (B, Lr, E) += scale * ds @ k_j
        dk[:, j0:j1] = torch.bmm(ds.transpose(1, 2), q[:, r0:]).mul_(scale)  # (B, Bc, E) scale * ds^T @ q
        # (computed, then copied into the slice: a batched product written straight into a strided slice
        # of dk runs as one small product per batch entry on the CPU)
    return dq, dk, dv


@functools.lru_cache(maxsize=64)
def _causal_bias(r0: int, r1: int, j0: int, j1: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(r1 - r0, j1 - j0): -inf where key j > row r, else 0 -- the causal mask of rows r0.. and keys j0..j1,
    added to the scores (s + 0 = s exactly; one in-place pass, where masked_fill_ needs a boolean mask:
    docs/benchmarks.md).  Cached: the same few corners recur at every step."""
    rows = torch.arange(r0, r1, device=device).view(-1, 1)
    keys = torch.arange(j0, j1, device=device).view(1, -1)
    return torch.zeros(r1 - r0, j1 - j0, dtype=dtype, device=device).masked_fill_(keys > rows, -math.inf)


def _block(mask: Tensor, r0: int, j0: int, j1: int) -> Tensor:
    """Rows r0.. and keys j0..j1 of a mask broadcastable to (*, L, S); a broadcast (size-1) axis stays as it is."""
    rows = slice(r0, None) if mask.shape[-2] != 1 else slice(None)
    cols = slice(j0, j1) if mask.shape[-1] != 1 else slice(None)
    return mask[..., rows, cols]


def one_block_forward(
    q: Tensor, k: Tensor, v: Tensor, spec, *, need_weights: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """q (B, L, E), k (B, S, E), v (B, S, Ev), ``spec`` (``Spec``: masks, scale, dropout)
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
        if spec.drop is not None:
            weights = weights * spec.dropout(0, 0, S, weights)  # A
        out = torch.bmm(weights, v)  # (B, L, Ev)
    else:
        if spec.drop is not None:
            p = p * spec.dropout(0, 0, S, p)  # (B, L, S) the weights that survive dropout (l summed before)
        out = torch.bmm(p, v).div_(l)  # (B, L, Ev) normalised after the product: Ev values per row, not S
    lse = l.log2().add_(m)  # (B, L, 1) m + log2(l)
    if empty is not None:
        lse.masked_fill_(empty, math.inf)  # 2^(s - inf) = 0: the row's weights stay zero in backward
    return out, lse, weights


def one_block_backward(
    q: Tensor, k: Tensor, v: Tensor, do: Tensor, dw: Tensor | None, D: Tensor, lse: Tensor, spec
) -> tuple[Tensor, Tensor, Tensor]:
    """q (B, L, E), k (B, S, E), v (B, S, Ev), dout (B, L, Ev), dweights (B, L, S) or None, D = rowsum(dout *
    out) (B, L, 1) (+ rowsum(dweights * A)), lse (B, L, 1) base 2 -> (dq (B, L, E), dk (B, S, E), dv (B, S, Ev))."""
    S, scale = spec.S, spec.scale
    s = torch.baddbmm(-lse, q, k.transpose(1, 2), alpha=scale * LOG2E)  # (B, L, S) s - lse (lse broadcast)
    spec.mask_(s, 0, 0, S)  # (-inf - lse is -inf: masking after the shift is the same)
    p = s.exp2_()  # (B, L, S) P, in the scores' memory
    dp = torch.bmm(do, v.transpose(1, 2))  # (B, L, S) dA = dout @ v^T
    if dw is not None:
        dp.add_(dw)  # dA also receives the weights' own gradient
    if spec.drop is not None:
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
