"""Layer normalisation, forward and backward, in Triton: llm.c's ``layernorm_forward`` / ``layernorm_backward``.

The layer's formula (layers/layernorm.py), per row of K values (the normalised trailing axes, flattened),
with the biased variance as torch normalises:

    mean = sum(x) / K,   rstd = 1 / sqrt(sum((x - mean)^2) / K + eps),   xhat = (x - mean) * rstd
    out  = weight * xhat + bias

Backward, per row, with dnorm = weight * dout (dxhat):

    dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
              term 1   term 2          term 3
    dweight = sum over rows of dout * xhat,   dbias = sum over rows of dout

which follows from xhat's Jacobian: d xhat_i / d x_j = rstd (delta_ij - 1/K - xhat_i xhat_j / K), so
dx_j = rstd (dnorm_j - sum_i dnorm_i / K - xhat_j sum_i dnorm_i xhat_i / K).  The two means are the two
reductions llm.c computes first (``dnorm_mean``, ``dnorm_norm_mean``); then one pass writes the three terms.

Kept from forward to backward: mean and rstd (one number per row, float32, float64 for float64 input), not
xhat, which the backward recomputes from x (llm.c's choice: two numbers a row instead of K).

Kernels: the forward holds one row in one block (K <= MAX_K) and computes the statistics in two passes over
it (mean, then the centred sum of squares: no cancellation).  The backward's program takes a run of rows,
writes each row's dx and adds dout * xhat and dout into partial sums of its own (one row of a (G, K) buffer
per program, no atomics, the same result every run); a second kernel sums the G partial rows into dweight
and dbias.  A float16/bfloat16 x with float32 weight is accepted, as torch's LayerNorm accepts it: statistics
in float32, out and dx in x's dtype, dweight and dbias in the weight's.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import acc_dtype, check_tensors, pow2, tl_dtype

MAX_K = 16384  # values a row: the forward holds a row in one block


@triton.jit
def _layer_norm_forward_kernel(
    X,
    W,
    B,
    OUT,
    MEAN,
    RSTD,
    R,
    K,
    sxr,
    sxk,
    sor,
    sok,
    sw,
    sb,
    EPS: tl.constexpr,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One row: its mean and rstd, and out = weight * xhat + bias."""
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    inside = k < K
    x = tl.load(X + row * sxr + k * sxk, mask=inside, other=0.0).to(ACC)  # (K,)
    mean = tl.sum(x, axis=0) / K
    xc = tl.where(inside, x - mean, 0.0)  # x - mean, 0 past the row's end
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / K + EPS)  # biased variance
    out = xc * rstd  # xhat
    if HAS_W:
        out = out * tl.load(W + k * sw, mask=inside, other=0.0).to(ACC)
    if HAS_B:
        out = out + tl.load(B + k * sb, mask=inside, other=0.0).to(ACC)
    tl.store(OUT + row * sor + k * sok, out.to(OUT.dtype.element_ty), mask=inside)
    first = k == 0  # one lane stores the row's statistics
    tl.store(MEAN + row + k, tl.where(first, mean, 0.0), mask=first)
    tl.store(RSTD + row + k, tl.where(first, rstd, 0.0), mask=first)


@triton.jit
def _layer_norm_backward_kernel(
    DOUT,
    X,
    W,
    MEAN,
    RSTD,
    DX,
    DW_PART,
    DB_PART,
    R,
    K,
    ROWS,
    sdr,
    sdk,
    sxr,
    sxk,
    sw,
    sdxr,
    sdxk,
    HAS_W: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """ROWS rows from program_id * ROWS: each row's dx; their dout * xhat and dout summed into this program's
    row of DW_PART and DB_PART (G, K)."""
    pid = tl.program_id(0)
    k = tl.arange(0, BLOCK_K)
    inside = k < K
    if HAS_W:
        w = tl.load(W + k * sw, mask=inside, other=0.0).to(ACC)
    dw = tl.zeros([BLOCK_K], dtype=ACC)  # sum of dout * xhat over this program's rows
    db = tl.zeros([BLOCK_K], dtype=ACC)  # sum of dout
    for i in range(0, ROWS):
        row = pid.to(tl.int64) * ROWS + i
        ok = row < R
        m = inside & ok
        x = tl.load(X + row * sxr + k * sxk, mask=m, other=0.0).to(ACC)
        dout = tl.load(DOUT + row * sdr + k * sdk, mask=m, other=0.0).to(ACC)
        mean = tl.load(MEAN + row, mask=ok, other=0.0)
        rstd = tl.load(RSTD + row, mask=ok, other=0.0)
        xhat = tl.where(m, (x - mean) * rstd, 0.0)
        dnorm = dout * w if HAS_W else dout  # dxhat
        dnorm_mean = tl.sum(dnorm, axis=0) / K
        dnorm_norm_mean = tl.sum(dnorm * xhat, axis=0) / K
        dx = (dnorm - dnorm_mean - xhat * dnorm_norm_mean) * rstd  # term 1 - term 2 - term 3, times rstd
        tl.store(DX + row * sdxr + k * sdxk, dx.to(DX.dtype.element_ty), mask=m)
        dw += dout * xhat
        db += dout
    if HAS_W:
        tl.store(DW_PART + pid * K + k, dw, mask=inside)
        tl.store(DB_PART + pid * K + k, db, mask=inside)


@triton.jit
def _column_sum_kernel(PART, OUT, G, K, so, BLOCK_G: tl.constexpr, BLOCK_K: tl.constexpr):
    """OUT[k] = sum over g of PART[g, k], PART a contiguous (G, K) buffer of partial sums."""
    k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    total = tl.zeros([BLOCK_K], dtype=PART.dtype.element_ty)
    for g0 in range(0, G, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        m = (g < G)[:, None] & (k < K)[None, :]
        total += tl.sum(tl.load(PART + g.to(tl.int64)[:, None] * K + k[None, :], mask=m, other=0.0), axis=0)
    tl.store(OUT + k * so, total.to(OUT.dtype.element_ty), mask=k < K)


def _as_rows(owner: str, x: Tensor, nk: int) -> Tensor:
    """x (*, S) -> (R, K), K = prod(S) over its last ``nk`` axes: a view where the axes merge, else a copy."""
    if nk > x.dim():
        raise ValueError(f"{owner}: x of shape {tuple(x.shape)} has fewer than {nk} axes to normalise")
    k = math.prod(x.shape[x.dim() - nk :])
    return x.reshape(-1, k)


def _check_params(owner: str, weight: Tensor | None, bias: Tensor | None, shape: tuple[int, ...]) -> None:
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != shape:
            raise ValueError(f"{owner}: {name} must have the normalised shape {shape}, got {tuple(p.shape)}")
    if bias is not None and weight is None:
        raise ValueError(f"{owner}: a bias without a weight is not a LayerNorm (torch has none)")


def layer_norm_forward(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    *,
    eps: float = 1e-5,
    normalized_shape: int | tuple[int, ...] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """out = weight * (x - mean) * rstd + bias over x's trailing axes, as F.layer_norm.

    Args:
        x: (*, S) float16, bfloat16, float32 or float64, any strides; CUDA (CPU under TRITON_INTERPRET=1).
        weight, bias: (S,) or None (elementwise_affine=False; or a weight and no bias).
        eps: added to the variance (a constant of the kernel: one compilation per value).
        normalized_shape: S; default weight's shape, or x's last axis without a weight.
    Returns:
        out: x's shape and dtype, contiguous.
        mean, rstd: (*,) one per row, float32 (float64 for float64 x): what layer_norm_backward needs.
    """
    owner = "layer_norm_forward"
    check_tensors(owner, _layer_norm_forward_kernel, x=x, weight=weight, bias=bias)
    if x.dim() == 0:
        raise ValueError(f"{owner}: x must have at least one axis to normalise, got a 0-d tensor")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    shape = tuple(weight.shape) if shape is None and weight is not None else shape or (x.shape[-1],)
    if tuple(x.shape[x.dim() - len(shape) :]) != tuple(shape):
        raise ValueError(f"{owner}: x of shape {tuple(x.shape)} does not end in the normalised shape {shape}")
    _check_params(owner, weight, bias, tuple(shape))
    if not (isinstance(eps, (int, float)) and eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"{owner}: eps must be a finite number >= 0, got {eps!r}")
    x2 = _as_rows(owner, x, len(shape))  # (R, K)
    R, K = x2.shape
    if K > MAX_K:
        raise ValueError(f"{owner}: rows of {K} values are more than the kernel holds in one block ({MAX_K})")
    acc = acc_dtype(x.dtype)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty(x.shape[: x.dim() - len(shape)], dtype=acc, device=x.device)  # (*,)
    rstd = torch.empty_like(mean)
    if R and K:
        o2 = out.view(R, K)
        w, b = (weight if weight is not None else x2), (bias if bias is not None else x2)  # unread when absent
        _layer_norm_forward_kernel[(R,)](
            x2,
            w,
            b,
            o2,
            mean,
            rstd,
            R,
            K,
            *x2.stride(),
            *o2.stride(),
            w.stride(-1),
            b.stride(-1),
            EPS=float(eps),
            HAS_W=weight is not None,
            HAS_B=bias is not None,
            ACC=tl_dtype(acc),
            BLOCK_K=pow2(K),
            num_warps=_warps(K),
        )
    return out, mean, rstd


def layer_norm_backward(
    dout: Tensor,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    *,
    rows_per_program: int | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """dx, dweight, dbias of layer_norm_forward, from what it kept (mean, rstd) and its inputs.

    Args:
        dout: (*, S) the upstream gradient, x's shape and dtype, any strides.
        x: (*, S) the forward's input.
        weight, bias: the forward's (S,) parameters or None; only whether bias is None is read of it.
        mean, rstd: (*,) from layer_norm_forward.
        rows_per_program: rows each program of the backward takes (and sums into its partial dweight/dbias);
            default about R / 512.
    Returns:
        dx: x's shape and dtype, contiguous.  dweight: weight's shape and dtype, or None without a weight.
        dbias: bias's shape and dtype, or None without a bias.
    """
    owner = "layer_norm_backward"
    check_tensors(owner, _layer_norm_backward_kernel, dout=dout, x=x, weight=weight, bias=bias, mean=mean, rstd=rstd)
    if dout.shape != x.shape or dout.dtype != x.dtype:
        raise ValueError(
            f"{owner}: dout must have x's shape {tuple(x.shape)} and dtype {x.dtype}, got "
            f"{tuple(dout.shape)} {dout.dtype}"
        )
    acc = acc_dtype(x.dtype)
    lead = tuple(mean.shape)
    if (
        x.shape[: len(lead)] != lead
        or rstd.shape != mean.shape
        or mean.dtype != acc
        or rstd.dtype != acc
        or len(lead) == x.dim()
    ):
        raise ValueError(
            f"{owner}: mean and rstd must be layer_norm_forward's, of shape x.shape[:-len(S)] and "
            f"dtype {acc}; got {tuple(mean.shape)} {mean.dtype} and {tuple(rstd.shape)} {rstd.dtype} "
            f"for x of shape {tuple(x.shape)}"
        )
    shape = tuple(x.shape[len(lead) :])
    _check_params(owner, weight, bias, shape)
    x2, d2 = _as_rows(owner, x, len(shape)), _as_rows(owner, dout, len(shape))  # (R, K)
    mean, rstd = mean.reshape(-1).contiguous(), rstd.reshape(-1).contiguous()  # (R,)
    R, K = x2.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dweight = torch.zeros(shape, dtype=weight.dtype, device=x.device) if weight is not None else None
    dbias = torch.zeros(shape, dtype=bias.dtype, device=x.device) if bias is not None else None
    if R == 0 or K == 0:
        return dx, dweight, dbias
    if rows_per_program is None:
        rows_per_program = triton.cdiv(R, 512)
    if not isinstance(rows_per_program, int) or rows_per_program < 1:
        raise ValueError(f"{owner}: rows_per_program must be an int >= 1, got {rows_per_program!r}")
    G = triton.cdiv(R, rows_per_program)
    has_w = weight is not None
    # (G, K) partial sums of dweight and dbias, one row per program (unwritten and unread without a weight)
    dw_part = torch.empty((G if has_w else 1, K), dtype=acc, device=x.device)
    db_part = torch.empty_like(dw_part)
    dx2 = dx.view(R, K)
    w = x2 if weight is None else weight
    _layer_norm_backward_kernel[(G,)](
        d2,
        x2,
        w,
        mean,
        rstd,
        dx2,
        dw_part,
        db_part,
        R,
        K,
        rows_per_program,
        *d2.stride(),
        *x2.stride(),
        w.stride(-1),
        *dx2.stride(),
        HAS_W=has_w,
        ACC=tl_dtype(acc),
        BLOCK_K=pow2(K),
        num_warps=_warps(K),
    )
    block_k = min(pow2(K), 128)
    for part, grad in ((dw_part, dweight), (db_part, dbias)):
        if grad is not None:
            flat = grad.view(-1)
            _column_sum_kernel[(triton.cdiv(K, block_k),)](
                part, flat, G, K, flat.stride(0), BLOCK_G=min(pow2(G), 32), BLOCK_K=block_k
            )
    return dx, dweight, dbias


def _warps(k: int) -> int:
    """Warps for a program that holds a row of k values: more for wider rows (Triton's layer norm tutorial)."""
    return min(max(pow2(k) // 256, 1), 8)
