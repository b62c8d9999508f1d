"""Convolution's and pooling's backwards (and max pooling's forward), arranged for speed.

layers/conv.py writes the convolution's backward in its im2col form: the input's windows unfolded into columns,
each kernel offset's share of dweight a product of dout with that offset's columns, dx the columns' gradients
folded back.  The same sums run faster through the convolution primitives.  With xp = x zero-padded,

    out[n, o, i, j] = b[o] + sum_{c, u, v} w[o, c, u, v] * xp[n, c, i sH + u dH, j sW + v dW]

(c running over the input channels of o's group), so

    dx = conv_transpose2d(dout, w, stride=s, padding=p, dilation=d, groups=G)
         -- the transposed convolution scatters each dout[n, o, i, j] back through the taps; its
            ``output_padding`` restores the rows/columns the forward's floor division dropped;
    dw[o, c, u, v] = sum_{n, i, j} dout[n, o, i, j] * xp[n, c, i sH + u dH, j sW + v dW]
         -- a correlation of the input with dout over the batch and the output positions.

The weight gradient's sum over (n, i, j) is one formula with three ways to run it (``weight_grad``), chosen by
shape because oneDNN's forward kernels, which the correlation runs on, are made for small kernels: the correlation
above as a convolution with the batch as the channel axis, dout as the kernel, and stride and dilation trading
places (any stride, dilation, groups); for stride 1 without groups the same correlation with the roles of x and
dout exchanged (dout the "input", x the "kernel"); and, for a layer with few input channels (a network's first),
the im2col product -- unfold x into its windows, one batched matrix product with dout -- where the unfolded copy
is small (float32 and float64 only: its per-sample products, summed afterwards, would each be rounded to a
half-precision dtype).  docs/benchmarks.md has the measurements behind each choice.

Pooling (layers/pool.py): ``max_pool2d`` takes a CPU input of many channels through ATen's channels-last kernel
(the same maxima and argmaxes); ``relu_max_pool_backward`` runs a ReLU's and the MaxPool2d after it as one
backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import cpp

FEW_CHANNELS = 8  # input channels per group below which dw is an im2col product (benchmarks/conv.py)
CHANNELS_LAST_FROM = 8  # channels from which max pooling on the CPU goes through the channels-last kernel


# -- convolution ---------------------------------------------------------------------------------------------


def input_grad(
    dout: Tensor,
    weight: Tensor,
    x_shape: torch.Size,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
) -> Tensor:
    """dx = the transposed convolution of dout with the weight, (N, C_in, H', W') for the padded input x_shape.

    conv_transpose2d's output is (H_out - 1) sH - 2 pH + dH (kH - 1) + 1 rows: the forward's floor division may have
    left up to sH - 1 trailing input rows that no window reached; output_padding adds them back (their gradient is
    zero), so the shape matches x's exactly."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = weight.shape[2:], stride, padding, dilation
    ho, wo = dout.shape[2], dout.shape[3]
    oph = x_shape[2] - ((ho - 1) * sh - 2 * ph + dh * (kh - 1) + 1)  # in [0, sH)
    opw = x_shape[3] - ((wo - 1) * sw - 2 * pw + dw * (kw - 1) + 1)  # in [0, sW)
    return F.conv_transpose2d(dout, weight, None, stride, padding, (oph, opw), groups, dilation)  # (N, C_in, H', W')


def weight_grad(
    x: Tensor,
    dout: Tensor,
    kernel_size: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
) -> Tensor:
    """dw[o, c, u, v] = sum_{n,i,j} dout[n, o, i, j] xp[n, c, i sH + u dH, j sW + v dW], (C_out, C_in / G, kH, kW)
    (possibly a strided view): one of the three forms of the module docstring, by shape."""
    c = x.shape[1]
    (kh, kw), (ph, pw), (dh, dw) = kernel_size, padding, dilation
    if c // groups < FEW_CHANNELS and x.dtype in (torch.float32, torch.float64):
        return weight_grad_im2col(x, dout, kernel_size, stride, padding, dilation, groups)
    if groups == 1 and stride == (1, 1) and ph <= dh * (kh - 1) and pw <= dw * (kw - 1):
        return weight_grad_exchanged(x, dout, kernel_size, padding, dilation)
    return weight_grad_correlation(x, dout, kernel_size, stride, padding, dilation, groups)


def weight_grad_correlation(
    x: Tensor,
    dout: Tensor,
    kernel_size: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
) -> Tensor:
    """dw as one convolution: the batch becomes the channel axis.  The "input" is x as (C_in / G, G * N, H, W) --
    group g's channels of every sample -- and the "kernel" is dout as (C_out, N, H_out, W_out), grouped G ways, so
    output channel o (of group g) sums over exactly the samples of g's input channels.  The kernel's taps i step
    through the input by sH (its dilation) and the output taps u by dH (its stride).  Its output (C_in / G, C_out,
    kH', kW') has kH' >= kH taps: beyond kH they read only the rows the forward dropped, and are cut off."""
    (kh, kw), g = kernel_size, groups
    n, c, h, w = x.shape
    xt = (
        x.transpose(0, 1) if g == 1 else x.view(n, g, c // g, h, w).permute(2, 1, 0, 3, 4).reshape(c // g, g * n, h, w)
    )  # (C_in/G, G*N, H, W)
    dt = dout.transpose(0, 1)  # (C_out, N, H_out, W_out)
    if x.device.type == "cpu":  # oneDNN's brgemm kernel reads a channels-last "input" as it is: no reorder
        xt = xt.contiguous(memory_format=torch.channels_last)
    corr = F.conv2d(xt, dt, None, dilation, padding, stride, g)  # (C_in/G, C_out, kH', kW')
    return corr[:, :, :kh, :kw].transpose(0, 1)  # (C_out, C_in/G, kH, kW), a view (not contiguous)


def weight_grad_exchanged(
    x: Tensor, dout: Tensor, kernel_size: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int]
) -> Tensor:
    """Stride 1, no groups: the same sum with h = i + u dH - pH substituted,

        dw[o, c, u, v] = sum_{n,h,w} x[n, c, h, w] dout_q[n, o, h + (kH-1-u) dH, w + (kW-1-v) dW]

    (dout_q: dout zero-padded by qH = dH (kH - 1) - pH >= 0 rows, qW columns), a convolution of dout as the "input"
    (C_out, N, H_out, W_out) with x as the "kernel" (C_in, N, H, W), stride (dH, dW): its output tap a = kH-1-u, so
    the taps come out reversed and are flipped back.  (x's extra "same" row/column, if any, is part of x here; the
    sizes work out to exactly kH x kW taps.)"""
    (kh, kw), (ph, pw), (dh, dw) = kernel_size, padding, dilation
    q = (dh * (kh - 1) - ph, dw * (kw - 1) - pw)
    corr = F.conv2d(dout.transpose(0, 1), x.transpose(0, 1), None, dilation, q)  # (C_out, C_in, kH, kW)
    return corr.flip(2, 3)


def weight_grad_im2col(
    x: Tensor,
    dout: Tensor,
    kernel_size: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
) -> Tensor:
    """dw as the im2col product: cols = unfold(x), (N, C_in kH kW, H_out W_out), each column the window one output
    pixel reads; then per group dw = sum_n dout_n (C_out/G, H_out W_out) @ cols_n^T, one batched matrix product and a
    sum over the batch (the layer's textbook, all offsets at once and without its fold for dx)."""
    (kh, kw), g = kernel_size, groups
    n, c = x.shape[:2]
    o = dout.shape[1]
    cols = F.unfold(x, (kh, kw), dilation, padding, stride)  # (N, C_in kH kW, P)
    p = cols.shape[2]
    # Computed transposed, cols_n @ dout_n^T (C_in kH kW, C_out/G) per sample: the long operand (dout) on the right,
    # which MKL runs faster here.
    if g == 1:
        dwt = torch.bmm(cols, dout.reshape(n, o, p).transpose(1, 2)).sum(0)  # (C_in kH kW, C_out)
        return dwt.t().view(o, c, kh, kw)  # a view (not contiguous)
    dwt = torch.matmul(cols.view(n, g, -1, p), dout.reshape(n, g, o // g, p).transpose(2, 3)).sum(0)
    return dwt.transpose(1, 2).reshape(o, c // g, kh, kw)  # (G, C_in/G kH kW, C_out/G) -> dw


# -- pooling -------------------------------------------------------------------------------------------------


def max_pool2d(x: Tensor, kernel_size, stride, padding, dilation, ceil_mode: bool) -> tuple[Tensor, Tensor]:
    """``F.max_pool2d(..., return_indices=True)`` for x (N, C, H, W): the maxima and each window's flat argmax in its
    H*W plane (the first on a tie), through ATen's channels-last kernel where that is faster.  Its CPU kernel for an
    (N, C, H, W) tensor walks each plane alone; the channels-last one runs the windows across channels in vector
    lanes, faster once there are channels enough to fill them even with the copies into that layout and back
    (docs/benchmarks.md).  The same maxima and argmaxes; out and the argmaxes are given back in x's layout."""
    if (
        x.device.type != "cpu"
        or x.shape[1] < CHANNELS_LAST_FROM
        or torch.compiler.is_compiling()
        or x.is_contiguous(memory_format=torch.channels_last)
    ):
        return F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)
    xp = x.contiguous(memory_format=torch.channels_last)
    out, idx = F.max_pool2d(xp, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)
    return out.contiguous(), idx.contiguous()


def max_pool2d_backward(dout: Tensor, idx: Tensor, hw: int) -> Tensor:
    """MaxPool2d's backward, dout (N, C, H_out, W_out) and its windows' flat argmaxes idx (the same shape) ->
    dx (N, C, H*W), dout added at each argmax: the C++ kernel on a CPU (one plane's zeroing and scatter while it is
    in cache, kernels/cpp/pool.cpp), the textbook's zeros and scatter_add_ elsewhere."""
    n, c = idx.shape[:2]
    d = dout.reshape(idx.shape)  # (unbatched: without the N axis)
    if cpp.usable(d):
        return cpp.ops.max_pool2d_backward(d.contiguous(), idx.contiguous(), hw)
    flat = idx.flatten(2)  # (N, C, H_out*W_out)
    return dout.new_zeros(n, c, hw).scatter_add_(2, flat, d.reshape(flat.shape))  # overlapping windows add up


def relu_max_pool_backward(pool, relu, dout: Tensor) -> Tensor | None:
    """The backwards of a ReLU and the MaxPool2d after it (layers ``relu`` and ``pool``, their forwards run), as one:
    ReLU's dx = scatter(dout) * (relu_out > 0), and the scatter puts values only at the argmaxes, where relu_out is
    the pool's own output (a window's maximum), so

        dx = scatter(dout * (out > 0))

    -- the same numbers (the mask is 0 or 1) from a mask a quarter of the size (a 2x2 pool), and no pass over the
    full-size gradient.  Consumes both layers' caches.  Returns None, consuming nothing, when ``relu``'s cached
    output is not the pool's input, when it or the pool's output was changed in place after the forward (a
    following in-place layer may legitimately change the pool's output: the mask is then not out > 0), or when
    dout is not shaped as the output; the caller then runs the two backwards, which refuse what is wrong."""
    kept, before = pool.kept, relu.kept
    if kept is None or before is None or before.out is not kept.fused.x or torch.compiler.is_compiling():
        return None  # (compiled: the two backwards, each with its check; the compiler fuses them)
    x, out, then = kept.fused
    try:
        if (x._version, out._version) != tuple(then):
            return None
    except RuntimeError:  # inference tensors keep no version counter
        return None
    if not (
        isinstance(dout, Tensor) and dout.shape == out.shape and dout.dtype == out.dtype and dout.device == out.device
    ):
        return None
    relu.discard_saved()
    return pool.backward(out.sign().mul_(dout))
