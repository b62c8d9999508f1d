"""FlashAttention-2, forward and backward, in Triton (Dao 2023, Algorithms 1 and 2; the backward laid out as
Triton's tutorial 06-fused-attention.py lays it out: the delta, then dK/dV, then dQ).

Shape legend: B = batch, H = heads, L = queries, S = keys/values, E = query/key width, Ev = value width
(E, Ev <= 128); Bm = queries a block, Bn = keys a block.  Attention is the only layer that mixes information
across time.  The textbook (layers/attention/scaled_dot_product.py's attention_forward / attention_backward), per
(batch, head):

    scores = scale * q @ k^T          (L, S)      causal: -inf where key s > query l (top-left aligned, as torch)
    P      = softmax(scores) per row  (L, S)
    out    = P @ v                    (L, Ev)
backward:
    dv = P^T @ dout,   dP = dout @ v^T,   dS = P * (dP - rowsum(dP * P)),   dq = scale dS @ k,   dk = scale dS^T @ q

Forward, one program per block of Bm queries, looping over key blocks j with an online softmax (running row
maximum m and row sum l; when the maximum grows, what was summed is rescaled by exp(m_old - m_new)):

    s   = scale * q @ k_j^T                        (Bm, Bn)
    m'  = max(m, rowmax(s));   p = exp(s - m')
    l   = l * exp(m - m') + rowsum(p);   acc = acc * exp(m - m') + p @ v_j
then out = acc / l, and each row's log-sum-exp lse = m + log(l) is kept: the (L, S) matrices never exist.
A causal program stops at the last key block its queries can see.

Backward, with P recomputed block by block from lse, P = exp(s - lse), and the row sums of dP * P replaced by
a number per row computed before the loops:

    D = rowsum(dout * out)            (= sum_s dP_s P_s, since dP_s = dout . v_s and out = sum_s P_s v_s)
    dK/dV kernel, one program per key block j, looping over query blocks i (causal: from the first that sees j):
        dv_j += P_ij^T @ dout_i,   dS_ij = P_ij * (dout_i @ v_j^T - D_i),   dk_j += scale dS_ij^T @ q_i
    dQ kernel, one program per query block i, looping over key blocks j:
        dq_i += scale dS_ij @ k_j
Each program owns what it writes: no atomics, the same result every run.

Exponentials are taken in base 2 (exp2 is the GPU's instruction): the scores carry a factor log2(e), and
lse, stored in natural log as torch's flash attention returns it, is converted on the way in and out.
Products accumulate in float32 (float64 for float64 inputs); float16/bfloat16 P and dS are rounded to the
input's dtype before their products, as FlashAttention does, float32 products are IEEE (no TF32).  The
scale is a constant of the kernel (one compilation per value): a float argument would reach a compiled kernel
as float32.  No attn_mask and no dropout: the layer's own path handles those.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import acc_dtype, check_block, check_tensors, dot, pow2, tl_dtype, upcast_dots

MAX_HEAD = 128
LOG2E = tl.constexpr(1.0 / math.log(2.0))
LN2 = tl.constexpr(math.log(2.0))


@triton.jit
def _attention_forward_kernel(
    Q,
    K,
    V,
    OUT,
    LSE,
    H,
    L,
    S,
    E,
    EV,
    sqb,
    sqh,
    sql,
    sqe,
    skb,
    skh,
    sks,
    ske,
    svb,
    svh,
    svs,
    sve,
    sob,
    soh,
    sol,
    soe,
    slb,
    slh,
    sll,
    SCALE: tl.constexpr,
    CAUSAL: tl.constexpr,
    ACC: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_EV: tl.constexpr,
):
    """Bm query rows of one (batch, head): their out and lse."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    Q += b * sqb + h * sqh
    K += b * skb + h * skh
    V += b * svb + h * svh
    rows = start_m + tl.arange(0, BLOCK_M)
    e, ev = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_EV)
    row_ok = rows < L
    q = tl.load(
        Q + rows.to(tl.int64)[:, None] * sql + e[None, :] * sqe, mask=row_ok[:, None] & (e < E)[None, :], other=0.0
    )  # (Bm, E)
    m = tl.full([BLOCK_M], float("-inf"), ACC)  # running row maximum of the base-2 scores
    l = tl.zeros([BLOCK_M], ACC)  # running row sum of exp2(s - m)
    acc = tl.zeros([BLOCK_M, BLOCK_EV], ACC)  # running sum of p @ v
    end = tl.minimum(S, start_m + BLOCK_M) if CAUSAL else S  # keys past the block's last query: all masked
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < S
        kt = tl.load(
            K + cols.to(tl.int64)[None, :] * sks + e[:, None] * ske, mask=(e < E)[:, None] & col_ok[None, :], other=0.0
        )  # (E, Bn) k_j^T
        v = tl.load(
            V + cols.to(tl.int64)[:, None] * svs + ev[None, :] * sve,
            mask=col_ok[:, None] & (ev < EV)[None, :],
            other=0.0,
        )  # (Bn, Ev)
        s = dot(q, kt, tl.zeros([BLOCK_M, BLOCK_N], ACC), UPCAST) * (SCALE * LOG2E)  # (Bm, Bn) base-2 scores
        allowed = col_ok[None, :]
        if CAUSAL:
            allowed = allowed & (cols[None, :] <= rows[:, None])
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet: exp2(-inf) = 0
        p = tl.exp2(s - m_new[:, None])  # (Bm, Bn)
        alpha = tl.exp2(m - m_new)  # rescales what was summed against the old maximum
        l = l * alpha + tl.sum(p, axis=1)
        acc = dot(p.to(Q.dtype.element_ty), v, acc * alpha[:, None], UPCAST)
        m = m_new
    l = tl.where(l == 0.0, 1.0, l)  # only for rows past L, which are not stored
    out = acc / l[:, None]
    lse = (m + tl.log2(l)) * LN2  # natural log
    tl.store(
        OUT + b * sob + h * soh + rows.to(tl.int64)[:, None] * sol + ev[None, :] * soe,
        out.to(OUT.dtype.element_ty),
        mask=row_ok[:, None] & (ev < EV)[None, :],
    )
    tl.store(LSE + b * slb + h * slh + rows * sll, lse, mask=row_ok)


@triton.jit
def _attention_delta_kernel(
    OUT,
    DOUT,
    DELTA,
    H,
    L,
    EV,
    sob,
    soh,
    sol,
    soe,
    sdb,
    sdh,
    sdl,
    sde,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_EV: tl.constexpr,
):
    """D = rowsum(dout * out) for Bm rows of one (batch, head), into DELTA (B, H, L) contiguous."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    ev = tl.arange(0, BLOCK_EV)
    inside = (rows < L)[:, None] & (ev < EV)[None, :]
    r = rows.to(tl.int64)[:, None]
    o = tl.load(OUT + b * sob + h * soh + r * sol + ev[None, :] * soe, mask=inside, other=0.0).to(ACC)
    do = tl.load(DOUT + b * sdb + h * sdh + r * sdl + ev[None, :] * sde, mask=inside, other=0.0).to(ACC)
    tl.store(DELTA + bh.to(tl.int64) * L + rows, tl.sum(o * do, axis=1), mask=rows < L)


@triton.jit
def _attention_dkdv_kernel(
    Q,
    K,
    V,
    DOUT,
    LSE,
    DELTA,
    DK,
    DV,
    H,
    L,
    S,
    E,
    EV,
    sqb,
    sqh,
    sql,
    sqe,
    skb,
    skh,
    sks,
    ske,
    svb,
    svh,
    svs,
    sve,
    sdb,
    sdh,
    sdl,
    sde,
    slb,
    slh,
    sll,
    skgb,
    skgh,
    skgs,
    skge,
    svgb,
    svgh,
    svgs,
    svge,
    SCALE: tl.constexpr,
    CAUSAL: tl.constexpr,
    ACC: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_EV: tl.constexpr,
):
    """dk_j and dv_j for one block of Bn keys of one (batch, head), looping over the query blocks."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    cols = start_n + tl.arange(0, BLOCK_N)
    col_ok = cols < S
    e, ev = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_EV)
    c = cols.to(tl.int64)[:, None]
    k = tl.load(
        K + b * skb + h * skh + c * sks + e[None, :] * ske, mask=col_ok[:, None] & (e < E)[None, :], other=0.0
    )  # (Bn, E)
    v = tl.load(
        V + b * svb + h * svh + c * svs + ev[None, :] * sve, mask=col_ok[:, None] & (ev < EV)[None, :], other=0.0
    )  # (Bn, Ev)
    Q += b * sqb + h * sqh
    DOUT += b * sdb + h * sdh
    LSE += b * slb + h * slh
    DELTA += bh.to(tl.int64) * L
    dk = tl.zeros([BLOCK_N, BLOCK_E], ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_EV], ACC)
    start = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0  # earlier queries see none of these keys
    for start_m in range(start, L, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        row_ok = rows < L
        r = rows.to(tl.int64)[:, None]
        q = tl.load(Q + r * sql + e[None, :] * sqe, mask=row_ok[:, None] & (e < E)[None, :], other=0.0)  # (Bm, E)
        do = tl.load(
            DOUT + r * sdl + ev[None, :] * sde, mask=row_ok[:, None] & (ev < EV)[None, :], other=0.0
        )  # (Bm, Ev)
        lse2 = tl.load(LSE + rows * sll, mask=row_ok, other=0.0) * LOG2E  # (Bm,) base 2
        delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)  # (Bm,) D
        st = dot(k, tl.trans(q), tl.zeros([BLOCK_N, BLOCK_M], ACC), UPCAST) * (SCALE * LOG2E)  # (Bn, Bm) s^T
        allowed = col_ok[:, None] & row_ok[None, :]
        if CAUSAL:
            allowed = allowed & (cols[:, None] <= rows[None, :])
        pt = tl.where(allowed, tl.exp2(st - lse2[None, :]), 0.0)  # (Bn, Bm) P^T
        dv = dot(pt.to(Q.dtype.element_ty), do, dv, UPCAST)  # += P^T @ dout
        dpt = dot(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], ACC), UPCAST)  # (Bn, Bm) dP^T = v @ dout^T
        dst = pt * (dpt - delta[None, :])  # (Bn, Bm) dS^T
        dk = dot(dst.to(Q.dtype.element_ty), q, dk, UPCAST)  # += dS^T @ q
    dk = dk * SCALE
    tl.store(
        DK + b * skgb + h * skgh + c * skgs + e[None, :] * skge,
        dk.to(DK.dtype.element_ty),
        mask=col_ok[:, None] & (e < E)[None, :],
    )
    tl.store(
        DV + b * svgb + h * svgh + c * svgs + ev[None, :] * svge,
        dv.to(DV.dtype.element_ty),
        mask=col_ok[:, None] & (ev < EV)[None, :],
    )


@triton.jit
def _attention_dq_kernel(
    Q,
    K,
    V,
    DOUT,
    LSE,
    DELTA,
    DQ,
    H,
    L,
    S,
    E,
    EV,
    sqb,
    sqh,
    sql,
    sqe,
    skb,
    skh,
    sks,
    ske,
    svb,
    svh,
    svs,
    sve,
    sdb,
    sdh,
    sdl,
    sde,
    slb,
    slh,
    sll,
    sqgb,
    sqgh,
    sqgl,
    sqge,
    SCALE: tl.constexpr,
    CAUSAL: tl.constexpr,
    ACC: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_EV: tl.constexpr,
):
    """dq_i for one block of Bm queries of one (batch, head), looping over the key blocks it sees."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    rows = start_m + tl.arange(0, BLOCK_M)
    row_ok = rows < L
    e, ev = tl.arange(0, BLOCK_E), tl.arange(0, BLOCK_EV)
    r = rows.to(tl.int64)[:, None]
    q = tl.load(
        Q + b * sqb + h * sqh + r * sql + e[None, :] * sqe, mask=row_ok[:, None] & (e < E)[None, :], other=0.0
    )  # (Bm, E)
    do = tl.load(
        DOUT + b * sdb + h * sdh + r * sdl + ev[None, :] * sde, mask=row_ok[:, None] & (ev < EV)[None, :], other=0.0
    )  # (Bm, Ev)
    lse2 = tl.load(LSE + b * slb + h * slh + rows * sll, mask=row_ok, other=0.0) * LOG2E  # (Bm,) base 2
    delta = tl.load(DELTA + bh.to(tl.int64) * L + rows, mask=row_ok, other=0.0)  # (Bm,) D
    K += b * skb + h * skh
    V += b * svb + h * svh
    dq = tl.zeros([BLOCK_M, BLOCK_E], ACC)
    end = tl.minimum(S, start_m + BLOCK_M) if CAUSAL else S
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < S
        c = cols.to(tl.int64)[:, None]
        k = tl.load(K + c * sks + e[None, :] * ske, mask=col_ok[:, None] & (e < E)[None, :], other=0.0)  # (Bn, E)
        v = tl.load(V + c * svs + ev[None, :] * sve, mask=col_ok[:, None] & (ev < EV)[None, :], other=0.0)  # (Bn, Ev)
        s = dot(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], ACC), UPCAST) * (SCALE * LOG2E)  # (Bm, Bn)
        allowed = row_ok[:, None] & col_ok[None, :]
        if CAUSAL:
            allowed = allowed & (cols[None, :] <= rows[:, None])
        p = tl.where(allowed, tl.exp2(s - lse2[:, None]), 0.0)  # (Bm, Bn) P
        dp = dot(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_N], ACC), UPCAST)  # (Bm, Bn) dP = dout @ v^T
        ds = p * (dp - delta[:, None])  # (Bm, Bn) dS
        dq = dot(ds.to(Q.dtype.element_ty), k, dq, UPCAST)  # += dS @ k
    dq = dq * SCALE
    tl.store(
        DQ + b * sqgb + h * sqgh + r * sqgl + e[None, :] * sqge,
        dq.to(DQ.dtype.element_ty),
        mask=row_ok[:, None] & (e < E)[None, :],
    )


def _heads(t: Tensor) -> Tensor:
    """(*, L, E) -> a (B, H, L, E) view: missing leading axes added, extra ones merged into B (a copy only where
    they do not merge)."""
    if t.dim() < 4:
        return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))
    return t.reshape(-1, *t.shape[-3:])


def _setup(owner: str, q: Tensor, k: Tensor, v: Tensor, scale, block_m, block_n, kernel):
    check_tensors(owner, kernel, q=q, k=k, v=v)
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            f"{owner}: q, k, v must be (*, L, E), (*, S, E), (*, S, Ev) with the same leading axes, "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if (
        q.shape[:-2] != k.shape[:-2]
        or k.shape[:-2] != v.shape[:-2]
        or q.shape[-1] != k.shape[-1]
        or k.shape[-2] != v.shape[-2]
    ):
        raise ValueError(
            f"{owner}: q, k, v must be (*, L, E), (*, S, E), (*, S, Ev) with the same leading axes, "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"{owner}: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    E, EV, S = q.shape[-1], v.shape[-1], k.shape[-2]
    if not (1 <= E <= MAX_HEAD and 1 <= EV <= MAX_HEAD):
        raise ValueError(f"{owner}: head widths E = {E}, Ev = {EV} must lie in [1, {MAX_HEAD}]")
    if S == 0:
        raise ValueError(f"{owner}: no keys (S = 0): every row's softmax would be empty")
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{owner}: scale must be a finite number, got {scale!r}")
    (bm, bn), warps = default_blocks(q.dtype, max(E, EV), backward=kernel is not _attention_forward_kernel)
    block_m = check_block(owner, "block_m", bm if block_m is None else block_m)
    block_n = check_block(owner, "block_n", bn if block_n is None else block_n)
    consts = dict(
        SCALE=float(scale),
        ACC=tl_dtype(acc_dtype(q.dtype)),
        UPCAST=upcast_dots(kernel, q.dtype),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_E=pow2(E, 16),
        BLOCK_EV=pow2(EV, 16),
        num_warps=warps,
    )
    return consts


def default_blocks(dtype: torch.dtype, width: int, backward: bool) -> tuple[tuple[int, int], int]:
    """((Bm, Bn), warps) for a dtype and head width: tiles whose kernels, compiled for sm_80 and sm_90, neither
    spill registers nor need more shared memory than an A100 gives a block (scripts/triton_compile.py says so);
    their speed is yet to be measured on a GPU."""
    wide = width > 64
    if dtype in (torch.float16, torch.bfloat16):
        return (64, 64), 8 if wide or backward else 4  # dK/dV holds two more tiles than the forward
    if dtype == torch.float32:  # IEEE float32 products run on the CUDA cores, operands in registers
        return ((16, 32) if wide else (32, 32)), 8
    return (16, 16), 8 if wide else 4  # float64


def flash_attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> tuple[Tensor, Tensor]:
    """out = softmax(scale * q @ k^T (+ causal mask)) @ v, as F.scaled_dot_product_attention(q, k, v,
    is_causal=causal, scale=scale), and each row's log-sum-exp for the backward.

    Args:
        q: (*, L, E), k: (*, S, E), v: (*, S, Ev); float16, bfloat16, float32 or float64, one dtype, any
            strides, E and Ev <= 128; CUDA (CPU under TRITON_INTERPRET=1).
        causal: query l sees keys s <= l (top-left aligned when L != S, as torch).
        scale: default 1 / sqrt(E); a constant of the kernel.
        block_m, block_n: queries and keys a block (powers of two >= 16).
    Returns:
        out: (*, L, Ev) in q's dtype, contiguous.
        lse: (*, L) the log-sum-exp of each row's scores (natural log), float32 (float64 for float64 inputs).
    """
    owner = "flash_attention_forward"
    consts = _setup(owner, q, k, v, scale, block_m, block_n, _attention_forward_kernel)
    lead, L = q.shape[:-2], q.shape[-2]
    out = torch.empty((*lead, L, v.shape[-1]), dtype=q.dtype, device=q.device)  # (*, L, Ev)
    lse = torch.empty((*lead, L), dtype=acc_dtype(q.dtype), device=q.device)  # (*, L)
    q4, k4, v4, o4, lse3 = _heads(q), _heads(k), _heads(v), _heads(out), _heads(lse.unsqueeze(-1))[..., 0]
    B, H = q4.shape[:2]
    if out.numel() == 0:
        return out, lse
    grid = (triton.cdiv(L, consts["BLOCK_M"]), B * H)
    _attention_forward_kernel[grid](
        q4,
        k4,
        v4,
        o4,
        lse3,
        H,
        L,
        k4.shape[2],
        q4.shape[3],
        v4.shape[3],
        *q4.stride(),
        *k4.stride(),
        *v4.stride(),
        *o4.stride(),
        *lse3.stride(),
        CAUSAL=bool(causal),
        **consts,
    )
    return out, lse


def flash_attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of flash_attention_forward from its inputs, its out and its lse (three kernels: D, dK/dV, dQ).

    Args:
        dout: (*, L, Ev) the upstream gradient, in q's dtype, any strides.
        q, k, v, out, lse: the forward's inputs and outputs.
        causal, scale, block_m, block_n: as in the forward (the blocks need not be the forward's).
    Returns:
        dq: (*, L, E), dk: (*, S, E), dv: (*, S, Ev), in q's dtype, contiguous.
    """
    owner = "flash_attention_backward"
    consts = _setup(owner, q, k, v, scale, block_m, block_n, _attention_dq_kernel)
    check_tensors(owner, _attention_dq_kernel, q=q, dout=dout, out=out)
    lead, L, S, E, EV = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    for name, t, shape in (("dout", dout, (*lead, L, EV)), ("out", out, (*lead, L, EV))):
        if tuple(t.shape) != tuple(shape) or t.dtype != q.dtype:
            raise ValueError(f"{owner}: {name} must be {tuple(shape)} in {q.dtype}, got {tuple(t.shape)} {t.dtype}")
    acc = acc_dtype(q.dtype)
    if not isinstance(lse, Tensor) or tuple(lse.shape) != (*lead, L) or lse.dtype != acc or lse.device != q.device:
        raise ValueError(
            f"{owner}: lse must be the forward's {(*lead, L)} {acc} tensor on {q.device}, got "
            + (f"{tuple(lse.shape)} {lse.dtype} on {lse.device}" if isinstance(lse, Tensor) else type(lse).__name__)
        )
    dq, dk, dv = (torch.empty(t.shape, dtype=q.dtype, device=q.device) for t in (q, k, v))
    if dq.numel() == 0 and dk.numel() == 0 and dv.numel() == 0:
        return dq, dk, dv
    q4, k4, v4, do4, o4 = _heads(q), _heads(k), _heads(v), _heads(dout), _heads(out)
    dq4, dk4, dv4, lse3 = _heads(dq), _heads(dk), _heads(dv), _heads(lse.unsqueeze(-1))[..., 0]
    B, H = q4.shape[:2]
    bm, bn = consts["BLOCK_M"], consts["BLOCK_N"]
    delta = torch.empty((B, H, L), dtype=acc, device=q.device)  # D = rowsum(dout * out)
    if L:
        _attention_delta_kernel[(triton.cdiv(L, bm), B * H)](
            o4,
            do4,
            delta,
            H,
            L,
            EV,
            *o4.stride(),
            *do4.stride(),
            ACC=consts["ACC"],
            BLOCK_M=bm,
            BLOCK_EV=consts["BLOCK_EV"],
        )
    strides = (*q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *lse3.stride())
    _attention_dkdv_kernel[(triton.cdiv(S, bn), B * H)](
        q4,
        k4,
        v4,
        do4,
        lse3,
        delta,
        dk4,
        dv4,
        H,
        L,
        S,
        E,
        EV,
        *strides,
        *dk4.stride(),
        *dv4.stride(),
        CAUSAL=bool(causal),
        **consts,
    )
    if L:
        _attention_dq_kernel[(triton.cdiv(L, bm), B * H)](
            q4, k4, v4, do4, lse3, delta, dq4, H, L, S, E, EV, *strides, *dq4.stride(), CAUSAL=bool(causal), **consts
        )
    return dq, dk, dv
