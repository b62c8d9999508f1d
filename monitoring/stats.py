"""The statistics a GradientMonitor records, as device-side tensors: nothing here reads a value back.

Each function returns a 1-D float64 tensor on the input's device, so a caller can concatenate
everything of one update and read it back in a single transfer (``torch.cat(...).tolist()``).
The layouts (which value sits where) are the ``*_FIELDS`` tuples beside each function.
"""

from __future__ import annotations

import torch
from torch import Tensor

GRAD_FIELDS = (
    "grad_mean",
    "grad_std",
    "grad_norm",
    "grad_abs_max",
    "grad_min",
    "grad_max",
    "grad_nonfinite",
    "hist_max",
)
PARAM_FIELDS = ("param_mean", "param_std", "param_norm")
ACT_FIELDS = ("mean", "std", "fraction")

TANH_SATURATION = 0.97  # |tanh(x)| > 0.97, i.e. |x| > 2.09: the local gradient 1 - y^2 is below 0.06
SIGMOID_SATURATION = 0.03  # sigmoid(x) < 0.03 or > 0.97, i.e. |x| > 3.48: the local gradient s(1-s) below 0.03


def _f64(*values: Tensor) -> Tensor:
    return torch.stack([v.to(torch.float64) for v in values])


def histogram(g: Tensor, bins: int) -> tuple[Tensor, Tensor]:
    """Counts of g's finite values in ``bins`` equal bins over [-r, r], r = max |g| over the finite values.

    -> (counts (bins,) int64, r), both on the device: the range is chosen there and
    needs no read-back.  A value at r lands in the last bin (as torch.histc counts it).  Where every value
    is 0 (or none is finite) r is taken as 1.  Non-finite values are left out of the counts (so
    ``g.numel() - counts.sum()`` counts them).
    """
    finite = torch.isfinite(g)
    n_bad = g.numel() - finite.sum()
    clean = torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)  # non-finite read as 0: r is the finite max
    lo, hi = torch.aminmax(clean)
    r = torch.maximum(-lo, hi)
    r = torch.where(r > 0, r, torch.ones_like(r))
    scale = bins / (2 * r)
    # Bin index (x + r) * bins / 2r, truncated, clamped so that x = r falls in the last bin (torch.histc's rule).
    idx = torch.addcmul(r * scale, clean, scale).clamp_(0, bins - 1).to(torch.int64)
    counts = torch.bincount(idx.reshape(-1), minlength=bins)
    # The non-finite values were binned as zeros: take them back out of 0's bin.
    zero_bin = (r * scale).clamp(0, bins - 1).to(torch.int64).reshape(1)
    counts.scatter_add_(0, zero_bin, -n_bad.reshape(1))
    return counts, r


def grad_stats(g: Tensor, bins: int) -> Tensor:
    """g: a gradient, any shape -> float64 (len(GRAD_FIELDS) + bins,): GRAD_FIELDS, then the histogram counts.

    Every statistic is torch's on the whole of g (a NaN or inf in g shows in them), except the histogram and
    its range, which are of the finite values; ``grad_nonfinite`` counts the others.  About ten passes over g.
    """
    g = g.detach()
    counts, r = histogram(g, bins)
    std, mean = torch.std_mean(g)
    lo, hi = torch.aminmax(g)
    nonfinite = g.numel() - counts.sum()
    head = _f64(mean, std, torch.linalg.vector_norm(g), torch.maximum(-lo, hi), lo, hi, nonfinite, r)
    return torch.cat([head, counts.to(torch.float64)])


def param_stats(w: Tensor) -> Tensor:
    """w: a parameter, any shape -> float64 (3,): PARAM_FIELDS (std unbiased, as torch.std)."""
    w = w.detach()
    std, mean = torch.std_mean(w)
    return _f64(mean, std, torch.linalg.vector_norm(w))


def update_ratio(w_new: Tensor, w_old: Tensor) -> Tensor:
    """|w_new - w_old| / |w_old| (Frobenius norms), a 0-dim float64 tensor."""
    return (torch.linalg.vector_norm(w_new - w_old) / torch.linalg.vector_norm(w_old)).to(torch.float64)


def total_norm(grads: list[Tensor]) -> Tensor:
    """The 2-norm of all gradients together, as torch.nn.utils.clip_grad_norm_ computes it (norm of the norms)."""
    if not grads:
        return torch.zeros((), dtype=torch.float64)
    return torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g.detach()) for g in grads]).to(torch.float64)
    )


def activation_stats(out: Tensor, kind: str | None) -> Tensor:
    """A layer's output (N, ...) -> float64 (3,): mean, std, and a fraction that depends on ``kind``.

    kind "relu": the share of units (positions of out[0]: features, or channel x pixel for images) that are
    zero for every example of the batch ("dead" for this batch).  kind "tanh": the share of outputs with
    |y| > 0.97.  kind "sigmoid": the share with y < 0.03 or y > 0.97 (the same 0.97 bound on |2y - 1| = 0.94,
    i.e. the tails where the local gradient s(1 - s) is below 0.03).  Other kinds: NaN.
    """
    out = out.detach()
    std, mean = torch.std_mean(out)
    if kind == "relu":
        fraction = (out.amax(0) <= 0).to(torch.float64).mean() if out.dim() > 0 else (out <= 0).to(torch.float64)
    elif kind == "tanh":
        fraction = (out.abs() > TANH_SATURATION).to(torch.float64).mean()
    elif kind == "sigmoid":
        fraction = ((out < SIGMOID_SATURATION) | (out > 1 - SIGMOID_SATURATION)).to(torch.float64).mean()
    else:
        fraction = torch.full((), float("nan"), dtype=torch.float64, device=out.device)
    return _f64(mean, std, fraction)
