"""MaxPool2d and AvgPool2d: 2-d pooling with hand-written backward passes.

Shape legend (see layers/layer.py): N = batch, C = channels, (H, W) -> (H_out, W_out) the spatial size
before / after, (kH, kW) window, (sH, sW) stride, (pH, pW) padding.  Pooling acts on each (n, c) plane
alone.  Output size per axis (rows shown; ceil_mode rounds up, but a window must start inside the input
or its left padding, as torch has it):

    H_out = floor_or_ceil((H + 2 pH - dH (kH - 1) - 1) / sH) + 1      (dH = 1 for average pooling)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

import kernels
from kernels import convolution

from .checks import Expects, check_bool, is_a
from .conv import pair
from .layer import BaseLayer
from .saved import versions


def pool_out_size(size: int, kernel: int, stride: int, padding: int, dilation: int, *, ceil_mode: bool) -> int:
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:  # the last window would start in the right padding
        out -= 1
    return out


class _Pool2d(BaseLayer):
    """Validation shared by the two pools: parameter-free, (N, C, H, W) in and out, or, as in torch, an
    unbatched (C, H, W) image in and (C, H_out, W_out) out (pooled as a batch of one)."""

    _dilation = (1, 1)
    expects = Expects(dims=(3, 4), shape="(N, C, H, W) or, unbatched, (C, H, W)")

    def _check_args(self, kernel_size, stride, padding, ceil_mode) -> None:
        owner = type(self).__name__
        self._k = pair(owner, "kernel_size", kernel_size, 1)
        self._s = self._k if stride is None else pair(owner, "stride", stride, 1)
        self._p = pair(owner, "padding", padding, 0)
        # torch.nn keeps the arguments as given (an int stays an int) and stride=None as kernel_size.
        self.kernel_size, self.padding = kernel_size, padding
        self.ceil_mode = check_bool(owner, "ceil_mode", ceil_mode)
        self.stride = kernel_size if stride is None else stride

    def _check_padding(self) -> None:
        """torch's rule: padding at most half the (dilated) window, so every window sees an input element."""
        for k, p, d in zip(self._k, self._p, self._dilation, strict=True):
            if p > (d * (k - 1) + 1) // 2:
                raise ValueError(
                    f"{type(self).__name__}: padding must be at most half of the (effective) kernel "
                    f"size, got padding={self.padding!r}, kernel_size={self.kernel_size!r}"
                )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"

    def _out_hw(self, x: Tensor) -> tuple[int, ...]:  # (H_out, W_out)
        return tuple(
            pool_out_size(
                x.shape[2 + i], self._k[i], self._s[i], self._p[i], self._dilation[i], ceil_mode=self.ceil_mode
            )
            for i in range(2)
        )

    def _batched(self, x: Tensor) -> Tensor:
        """x as (N, C, H, W): an unbatched (C, H, W) image gets a batch axis of one (a view); checks its size."""
        x4 = x.unsqueeze(0) if x.dim() == 3 else x
        ho, wo = self._out_hw(x4)
        if ho < 1 or wo < 1:
            raise ValueError(
                f"{self!r}: input of spatial size {tuple(x.shape[-2:])} is too small for the window "
                f"(output size would be {(ho, wo)})"
            )
        return x4


class MaxPool2d(_Pool2d):
    """out[n, c, i, j] = max over the window of x (padding is -inf: never the max).

    Backward: each window's gradient goes to the one input element that was its maximum (its argmax;
    the first one on a tie, as torch picks); where windows overlap, an element that is the maximum of
    several receives the sum:

        dx = zeros (N, C, H * W);  dx[n, c, argmax[n, c, i, j]] += dout[n, c, i, j]   (a scatter-add)

    The forward gets the argmax from ``F.max_pool2d(return_indices=True)`` (flat indices into each H*W
    plane) and keeps only those and the input's shape.  ``dilation`` and ``ceil_mode`` are supported;
    ``return_indices=True`` is not (a layer returns one tensor).  Nothing a caller holds is read by the backward
    (the argmax is the layer's own), so an in-place change of x or of the output after the forward changes
    nothing here; the kernel that runs a ReLU's backward and this pool's as one (kernels/convolution.py, from a
    Sequential) reads both and checks them itself (``Saved.fused``).  The kernel's forward takes a CPU input of many
    channels through the channels-last pooling kernel: the same maxima and argmaxes.
    """

    torch_class = torch.nn.MaxPool2d
    _ctor_args = ("kernel_size", "stride", "padding", "dilation", "return_indices", "ceil_mode")

    class Fused(NamedTuple):
        """What only the ReLU -> MaxPool2d kernel reads, with its own version record: a NamedTuple inside Saved is
        not a tensor field, so the plain backward, which reads neither tensor, does not refuse their change."""

        x: Tensor  # the pool's input (the ReLU's output, when a ReLU came before)
        out: Tensor  # the pool's output: out > 0 is the ReLU's mask at each argmax
        versions: tuple  # of x and out, at the forward

    class Saved(NamedTuple):
        idx: Tensor  # (N, C, H_out, W_out) each window's argmax, a flat index into its H*W plane
        batched: torch.Size  # (N, C, H, W): the input with its batch axis
        shape: torch.Size  # the input's own shape, given back to dx
        fused: MaxPool2d.Fused

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        self._check_args(kernel_size, stride, padding, ceil_mode)
        self._dilation = pair("MaxPool2d", "dilation", dilation, 1)
        self.dilation = dilation
        if return_indices is not False:
            raise ValueError(
                f"MaxPool2d: return_indices must be False (a layer returns one tensor; the argmax is "
                f"kept inside for the backward), got {return_indices!r}"
            )
        self.return_indices = False
        self._check_padding()

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + (f", dilation={self.dilation}" if self._dilation != (1, 1) else "")
            + (", ceil_mode=True" if self.ceil_mode else "")
        )

    def forward_math(self, x: Tensor):
        """x: (N, C, H, W) -> out: (N, C, H_out, W_out); unbatched (C, H, W) -> (C, H_out, W_out)."""
        x4 = self._batched(x)
        pool = convolution.max_pool2d if kernels.enabled() else _max_pool2d  # (the kernel: channels-last on a CPU)
        out, idx = pool(x4, self._k, self._s, self._p, self._dilation, self.ceil_mode)  # values, flat argmax in H*W
        if x4 is not x:
            out = out.squeeze(0)  # unbatched
        return out, self.Saved(idx, x4.shape, x.shape, self.Fused(x, out, versions(x, out)))

    def backward_math(self, dout: Tensor, saved: Saved) -> Tensor:
        """dout: (N, C, H_out, W_out) -> dx: (N, C, H, W), dout scattered to each window's argmax (unbatched:
        without the N axis)."""
        n, c, h, w = saved.batched
        if not kernels.enabled():
            dx = dout.new_zeros(n, c, h * w)  # (N, C, H*W)
            idx = saved.idx.flatten(2)  # (N, C, H_out*W_out) (sizes spelled out, not -1: N may be 0)
            dx.scatter_add_(2, idx, dout.reshape(idx.shape))  # overlapping windows add up
            return dx.view(saved.shape)
        # the same scatter, one plane at a time while it is in cache: kernels/convolution.py
        return convolution.max_pool2d_backward(dout, saved.idx, h * w).view(saved.shape)


def _max_pool2d(x: Tensor, kernel_size, stride, padding, dilation, ceil_mode: bool) -> tuple[Tensor, Tensor]:
    return F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)


class AvgPool2d(_Pool2d):
    """out[n, c, i, j] = sum of x over the window / divisor[i, j].

    The divisor is kH * kW (``count_include_pad=True``: padding zeros count), or the number of real input
    elements in the window (``count_include_pad=False``), or ``divisor_override``.  With ``ceil_mode``
    a window may run past the padded input; torch's divisor then counts only the part inside it, and so
    does this one (``_divisor``).

    Backward: every element of a window receives that window's dout / divisor, and windows add up where
    they overlap -- exactly a transposed convolution of dout / divisor with a kernel of ones, one channel
    at a time:

        dx = conv_transpose2d((dout / divisor) as (N*C, 1, H_out, W_out), ones (1, 1, kH, kW),
                              stride=s, padding=p)               cut or padded to (H, W)

    Kept: only the input's shape (the divisor is rebuilt from it in backward): nothing that an in-place
    change could alter.
    """

    torch_class = torch.nn.AvgPool2d
    _ctor_args = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")

    class Saved(NamedTuple):
        batched: torch.Size  # (N, C, H, W): the input with its batch axis
        shape: torch.Size  # the input's own shape, given back to dx

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        self._check_args(kernel_size, stride, padding, ceil_mode)
        check_bool("AvgPool2d", "count_include_pad", count_include_pad)
        if divisor_override is not None and (not is_a(divisor_override, int) or divisor_override == 0):
            raise ValueError(f"AvgPool2d: divisor_override must be None or a non-zero int, got {divisor_override!r}")
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override
        self._check_padding()

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + (", ceil_mode=True" if self.ceil_mode else "")
            + ("" if self.count_include_pad else ", count_include_pad=False")
            + ("" if self.divisor_override is None else f", divisor_override={self.divisor_override}")
        )

    def forward_math(self, x: Tensor):
        """x: (N, C, H, W) -> out: (N, C, H_out, W_out); unbatched (C, H, W) -> (C, H_out, W_out)."""
        x4 = self._batched(x)
        out = F.avg_pool2d(
            x4, self._k, self._s, self._p, self.ceil_mode, self.count_include_pad, self.divisor_override
        )  # (N, C, H_out, W_out)
        if x4 is not x:
            out = out.squeeze(0)  # unbatched
        return out, self.Saved(x4.shape, x.shape)

    def _divisor(self, hw: tuple[int, int], out_hw: tuple[int, int], like: Tensor) -> Tensor | float:
        """(H_out, W_out) divisors of the windows (a number where they are all kH * kW), torch's rule:
        per axis, a window starting at i s - p ends at min(start + k, size + p) (ceil_mode may cut it
        there); it holds end - start elements counting padding, and min(end, size) - max(start, 0) real ones."""
        if self.divisor_override is not None:
            return float(self.divisor_override)
        if self.count_include_pad and not self.ceil_mode:  # every window fits inside the padded input
            return float(self._k[0] * self._k[1])
        counts = []
        for size, n_out, k, s, p in zip(hw, out_hw, self._k, self._s, self._p, strict=True):
            start = torch.arange(n_out, device=like.device, dtype=like.dtype) * s - p  # (n_out,)
            end = torch.clamp(start + k, max=size + p)
            counts.append(end - start if self.count_include_pad else end.clamp(max=size) - start.clamp(min=0))
        return counts[0][:, None] * counts[1][None, :]  # (H_out, W_out)

    def backward_math(self, dout: Tensor, saved: Saved) -> Tensor:
        """dout: (N, C, H_out, W_out) -> dx: (N, C, H, W) (unbatched: without the N axis)."""
        (n, c, h, w), ho, wo = saved.batched, dout.shape[-2], dout.shape[-1]
        (kh, kw), (sh, sw), (ph, pw) = self._k, self._s, self._p
        g = (dout / self._divisor((h, w), (ho, wo), dout)).reshape(n * c, 1, ho, wo)  # (N*C, 1, H_out, W_out)
        ones = dout.new_ones(1, 1, kh, kw)
        # The transposed convolution gives (H_out - 1) sH - 2 pH + kH rows: fewer than H when the floor
        # division dropped trailing rows (output_padding adds them, zero), more with ceil_mode (cut off).
        full_h, full_w = (ho - 1) * sh - 2 * ph + kh, (wo - 1) * sw - 2 * pw + kw
        dx = F.conv_transpose2d(g, ones, None, (sh, sw), (ph, pw), (max(h - full_h, 0), max(w - full_w, 0)))
        return dx[:, :, :h, :w].reshape(saved.shape)  # (N, C, H, W) or (C, H, W)
