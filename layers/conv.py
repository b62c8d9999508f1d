"""Conv2d: 2-d convolution whose backward is two more convolutions, written out by hand.

Shape legend (see layers/layer.py): N = batch, C_in / C_out = input / output channels, G = groups,
(H, W) = input height and width, (H_out, W_out) = output height and width, (kH, kW) = kernel size,
(sH, sW) = stride, (pH, pW) = padding, (dH, dW) = dilation.  Per spatial axis (rows shown):

    H_out = floor((H + 2 pH - dH (kH - 1) - 1) / sH) + 1

The layer's backward is its own formula, expressed through the convolution primitives (the
textbook im2col version -- unfold, one matrix product, fold -- is ``reference.conv2d_forward`` /
``conv2d_backward``, tied to this one by tests/test_conv.py).  With xp = x zero-padded,

    out[n, o, i, j] = b[o] + sum_{c, u, v} w[o, c, u, v] * xp[n, c, i sH + u dH, j sW + v dW]

(c running over the input channels of o's group), each input pixel is touched by the kernel taps
that reach it, so

    dx = conv_transpose2d(dout, w, stride=s, padding=p, dilation=d, groups=G)
         -- the transposed convolution scatters each dout[n, o, i, j] back through the taps; its
            ``output_padding`` restores the rows/columns the forward's floor division dropped;
    dw[o, c, u, v] = sum_{n, i, j} dout[n, o, i, j] * xp[n, c, i sH + u dH, j sW + v dW]
         -- a correlation of the input with dout over the batch and the output positions: a
            convolution with the batch as the channel axis, dout as the kernel, and stride and
            dilation trading places (the kernel dout steps by sH; the output tap u steps by dH);
    db[o] = sum_{n, i, j} dout[n, o, i, j].

The weight gradient's sum over (n, i, j) is one formula with three ways to run it (``Conv2d._weight_grad``),
chosen by shape because oneDNN's forward kernels, which the correlation runs on, are made for small kernels:
the correlation above (any stride, dilation, groups); for stride 1 without groups the same correlation with
the roles of x and dout exchanged (dout the "input", x the "kernel"; 10-20% faster on CPU); and, for a layer
with few input channels (a network's first), the textbook im2col product -- unfold x into its windows,
one batched matrix product with dout -- which there beats the correlation 2-4x (the unfolded copy is only
C_in kH kW times x; float32 and float64 only: its per-sample products, summed afterwards, would each be rounded
to a half-precision dtype).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import Expects, check_bool, check_int, is_a
from .init import torch_default_params
from .layer import BaseLayer, learned


_FEW_CHANNELS = 8  # input channels per group below which dw is an im2col product (benchmarks/conv.py)


def pair(owner: str, name: str, value: object, lo: int) -> tuple[int, int]:
    """An int or a pair of ints, each >= lo, as (rows, cols); anything else is a ValueError naming it."""
    items = (value, value) if is_a(value, int) else value
    if not (isinstance(items, (tuple, list)) and len(items) == 2 and all(is_a(v, int) and v >= lo for v in items)):
        raise ValueError(f"{owner}: {name} must be an int >= {lo} or a pair of them, got {value!r}")
    return int(items[0]), int(items[1])


def conv_out_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """Output length of a convolution along one axis (floor division: trailing rows may go unused)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


class Conv2d(BaseLayer):
    """2-d convolution (cross-correlation, as in every framework): x (N, C_in, H, W) -> (N, C_out, H_out, W_out).

    As in torch, an unbatched (C_in, H, W) image gives (C_out, H_out, W_out) (a batch of one inside), and an
    empty batch (N = 0) gives an empty output and zero weight and bias gradients.

    Same arguments, defaults, parameter names, layouts and initialisation as ``torch.nn.Conv2d``:
    ``weight`` (C_out, C_in / G, kH, kW) and ``bias`` (C_out,), Kaiming-uniform as nn.Conv2d draws
    them (``layers.init``), so one seed gives identical weights.  ``kernel_size``, ``stride``,
    ``padding`` and ``dilation`` take an int or a pair; ``padding`` also ``"valid"`` (none) or
    ``"same"`` (output size = input size, stride 1 only; an odd total padding puts the extra row and
    column at the bottom and right, as torch does).  Only ``padding_mode="zeros"`` is supported.

    Forward is ``F.conv2d``; backward is the hand-written formula of the module docstring:
    ``backward(dout, need_input_grad=True)`` adds dw and db into ``.grad`` and returns dx (or None
    with ``need_input_grad=False``: the first layer of a network skips that transposed convolution).
    Kept between the two: the (padded) input, for dw, and the weight, for dx; changing either in place in
    between (an optimizer step before backward) is refused, as torch.autograd refuses it (layers/saved.py).
    Written in the template (layers/template.py): the base checks, keeps, versions and accumulates.
    """

    _param_names = ("weight", "bias")
    expects = Expects(dims=(3, 4), size=(-3, "in_channels"), like=("weight",), like_name="input", floating=False,
                      shape="(N, {in_channels}, H, W) or, unbatched, ({in_channels}, H, W)")
    torch_class = torch.nn.Conv2d
    _ctor_args = ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias",
                  "padding_mode")

    class Saved(NamedTuple):
        x: Tensor  # (N, C_in, H', W') the input as convolved (with the extra "same" row/column), for dw
        weight: Tensor  # (C_out, C_in / G, kH, kW), for dx
        hw: tuple[int, int]  # the input's (H, W): dx is cut back to it
        unbatched: bool  # the input was (C_in, H, W): dout and dx lose the batch axis of one

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] | str = 0,
                 dilation: int | tuple[int, int] = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        owner = "Conv2d"
        self.in_channels = check_int(owner, "in_channels", in_channels)
        self.out_channels = check_int(owner, "out_channels", out_channels)
        self.groups = check_int(owner, "groups", groups)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"{owner}: in_channels ({in_channels}) and out_channels ({out_channels}) must both be "
                             f"divisible by groups ({groups})")
        self.kernel_size = pair(owner, "kernel_size", kernel_size, 1)
        self.stride = pair(owner, "stride", stride, 1)
        self.dilation = pair(owner, "dilation", dilation, 1)
        check_bool(owner, "bias", bias)
        if padding_mode != "zeros":
            raise ValueError(f"{owner}: padding_mode must be 'zeros' (reflect, replicate and circular padding are "
                             f"not supported), got {padding_mode!r}")
        self.padding_mode = padding_mode
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"{owner}: dtype must be floating point, got {dtype}")
        (kh, kw), (dh, dw) = self.kernel_size, self.dilation
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"{owner}: padding must be 'same', 'valid', an int >= 0 or a pair of them, "
                                 f"got {padding!r}")
            if padding == "same" and self.stride != (1, 1):
                raise ValueError(f"{owner}: padding='same' needs stride 1 (as in torch), got stride={stride!r}")
            self.padding: tuple[int, int] | str = padding
            # "same": total padding d (k - 1) per axis, half on each side, the odd one at the bottom/right.
            th, tw = (dh * (kh - 1), dw * (kw - 1)) if padding == "same" else (0, 0)
            self._pad = (th // 2, tw // 2)  # symmetric part, given to the convolutions
            self._extra = (th - 2 * (th // 2), tw - 2 * (tw // 2))  # 0 or 1 more row (bottom) / column (right)
        else:
            self.padding = self._pad = pair(owner, "padding", padding, 0)
            self._extra = (0, 0)
        self.weight, self.bias = learned(*torch_default_params((out_channels, in_channels // groups, kh, kw), bias,
                                                               device=device, dtype=dtype))

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding!r}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + ("" if self.bias is not None else ", bias=False")

    def _out_hw(self, h: int, w: int) -> tuple[int, int]:
        """(H_out, W_out) for an input already carrying the extra "same" row/column."""
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel_size, self.stride, self._pad, self.dilation
        return conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw)

    def forward_math(self, x: Tensor):
        """x: (N, C_in, H, W) -> out: (N, C_out, H_out, W_out); or unbatched, (C_in, H, W) -> (C_out, H_out, W_out)."""
        unbatched = x.dim() == 3
        if unbatched:
            x = x.unsqueeze(0)  # (1, C_in, H, W), a view; the output loses the axis again
        hw = (x.shape[2], x.shape[3])
        if self._extra != (0, 0):  # "same" with an odd total padding: the extra zeros at the bottom/right
            x = F.pad(x, (0, self._extra[1], 0, self._extra[0]))  # (N, C_in, H + 1?, W + 1?)
        ho, wo = self._out_hw(x.shape[2], x.shape[3])
        if ho < 1 or wo < 1:
            span = tuple(d * (k - 1) + 1 for k, d in zip(self.kernel_size, self.dilation))
            raise ValueError(f"{self!r}: input of spatial size {hw} (padding {self._pad}) is smaller than the "
                             f"dilated kernel {span}")
        out = F.conv2d(x, self.weight, self.bias, self.stride, self._pad, self.dilation, self.groups)
        out = out.squeeze(0) if unbatched else out  # (N, C_out, H_out, W_out) or (C_out, H_out, W_out)
        return out, self.Saved(x, self.weight, hw, unbatched)

    def backward_math(self, dout: Tensor, saved: Saved):
        """dout: (N, C_out, H_out, W_out) -> dx: (N, C_in, H, W) (None if not ``need_input_grad``);
        dw (C_out, C_in / G, kH, kW) and db (C_out,), added into weight.grad and bias.grad.
        Unbatched: dout (C_out, H_out, W_out) -> dx (C_in, H, W)."""
        # dx = conv_transpose2d(dout, w);  dw = x correlated with dout over (n, i, j);  db = sum of dout over (n, i, j)
        x, (h, w) = saved.x, saved.hw
        dout = dout.unsqueeze(0) if saved.unbatched else dout  # (N, C_out, H_out, W_out)
        dx = None
        if self.needs_input_grad:
            dx = self._input_grad(dout, saved.weight, x.shape)[:, :, :h, :w]  # (N, C_in, H, W): no "same" extra
            dx = dx.squeeze(0) if saved.unbatched else dx
        # dw and db as callables: computed only for a parameter that wants one (a frozen one costs nothing)
        return dx, {"weight": lambda: self._weight_grad_for(x, dout), "bias": lambda: dout.sum((0, 2, 3))}

    def _weight_grad_for(self, x: Tensor, dout: Tensor) -> Tensor:
        """dw, (C_out, C_in / G, kH, kW): added into an existing ``.grad`` straight from the strided view the
        correlation gives (no copy), made contiguous only when it becomes ``.grad``."""
        w = self.weight
        if x.shape[0] == 0:  # an empty batch: nothing to sum, so dw = 0 (the correlation has no channels to run on)
            return w.new_zeros(w.shape)
        dw = self._weight_grad(x, dout)
        return dw if w.grad is not None else dw.contiguous()  # the weight's layout

    def _input_grad(self, dout: Tensor, weight: Tensor, x_shape: torch.Size) -> Tensor:
        """dx = the transposed convolution of dout with the weight, (N, C_in, H', W') for the padded input.

        conv_transpose2d's output is (H_out - 1) sH - 2 pH + dH (kH - 1) + 1 rows: the forward's floor
        division may have left up to sH - 1 trailing input rows that no window reached; output_padding
        adds them back (their gradient is zero), so the shape matches x's exactly."""
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel_size, self.stride, self._pad, self.dilation
        ho, wo = dout.shape[2], dout.shape[3]
        oph = x_shape[2] - ((ho - 1) * sh - 2 * ph + dh * (kh - 1) + 1)  # in [0, sH)
        opw = x_shape[3] - ((wo - 1) * sw - 2 * pw + dw * (kw - 1) + 1)  # in [0, sW)
        return F.conv_transpose2d(dout, weight, None, self.stride, self._pad, (oph, opw), self.groups,
                                  self.dilation)  # (N, C_in, H', W')

    def _weight_grad(self, x: Tensor, dout: Tensor) -> Tensor:
        """dw[o, c, u, v] = sum_{n,i,j} dout[n, o, i, j] xp[n, c, i sH + u dH, j sW + v dW], (C_out, C_in / G, kH, kW)
        (possibly a strided view): one of the three forms of the module docstring, by shape."""
        g, c = self.groups, x.shape[1]
        (kh, kw), (ph, pw), (dh, dw) = self.kernel_size, self._pad, self.dilation
        if c // g < _FEW_CHANNELS and x.dtype in (torch.float32, torch.float64):
            return self._weight_grad_im2col(x, dout)  # (float16/bfloat16 would round each sample's product)
        if g == 1 and self.stride == (1, 1) and ph <= dh * (kh - 1) and pw <= dw * (kw - 1):
            return self._weight_grad_exchanged(x, dout)
        return self._weight_grad_correlation(x, dout)

    def _weight_grad_correlation(self, x: Tensor, dout: Tensor) -> Tensor:
        """dw as one convolution: the batch becomes the channel axis.  The "input" is x as (C_in / G, G * N, H, W)
        -- group g's channels of every sample -- and the "kernel" is dout as (C_out, N, H_out, W_out), grouped G
        ways, so output channel o (of group g) sums over exactly the samples of g's input channels.  The kernel's
        taps i step through the input by sH (its dilation) and the output taps u by dH (its stride).  Its output
        (C_in / G, C_out, kH', kW') has kH' >= kH taps: beyond kH they read only the rows the forward dropped,
        and are cut off."""
        (kh, kw), g = self.kernel_size, self.groups
        n, c, h, w = x.shape
        xt = x.transpose(0, 1) if g == 1 else \
            x.view(n, g, c // g, h, w).permute(2, 1, 0, 3, 4).reshape(c // g, g * n, h, w)  # (C_in/G, G*N, H, W)
        dt = dout.transpose(0, 1)  # (C_out, N, H_out, W_out)
        if x.device.type == "cpu":
            # Measured (benchmarks/conv.py): oneDNN's brgemm kernel reads a channels-last "input" as it is,
            # which saves a reorder; 0.8x -> 0.9-0.96x of nn.Conv2d for inner layers.
            xt = xt.contiguous(memory_format=torch.channels_last)
        corr = F.conv2d(xt, dt, None, self.dilation, self._pad, self.stride, g)  # (C_in/G, C_out, kH', kW')
        return corr[:, :, :kh, :kw].transpose(0, 1)  # (C_out, C_in/G, kH, kW), a view (not contiguous)

    def _weight_grad_exchanged(self, x: Tensor, dout: Tensor) -> Tensor:
        """Stride 1, no groups: the same sum with h = i + u dH - pH substituted,

            dw[o, c, u, v] = sum_{n,h,w} x[n, c, h, w] dout_q[n, o, h + (kH-1-u) dH, w + (kW-1-v) dW]

        (dout_q: dout zero-padded by qH = dH (kH - 1) - pH >= 0 rows, qW columns), a convolution of dout as the
        "input" (C_out, N, H_out, W_out) with x as the "kernel" (C_in, N, H, W), stride (dH, dW): its output
        tap a = kH-1-u, so the taps come out reversed and are flipped back.  (x's extra "same" row/column, if
        any, is part of x here; the sizes work out to exactly kH x kW taps.)"""
        (kh, kw), (ph, pw), (dh, dw) = self.kernel_size, self._pad, self.dilation
        q = (dh * (kh - 1) - ph, dw * (kw - 1) - pw)
        corr = F.conv2d(dout.transpose(0, 1), x.transpose(0, 1), None, self.dilation, q)  # (C_out, C_in, kH, kW)
        return corr.flip(2, 3)

    def _weight_grad_im2col(self, x: Tensor, dout: Tensor) -> Tensor:
        """dw as the textbook product: cols = unfold(x), (N, C_in kH kW, H_out W_out), each column the window one
        output pixel reads; then per group dw = sum_n dout_n (C_out/G, H_out W_out) @ cols_n^T, one batched matrix
        product and a sum over the batch (layers/reference.py's conv2d_backward, without its fold for dx)."""
        (kh, kw), g = self.kernel_size, self.groups
        n, c = x.shape[:2]
        o = self.out_channels
        cols = F.unfold(x, (kh, kw), self.dilation, self._pad, self.stride)  # (N, C_in kH kW, P)
        p = cols.shape[2]
        # Computed transposed, cols_n @ dout_n^T (C_in kH kW, C_out/G) per sample: the long operand (dout) on the
        # right, which MKL runs 1.35x as fast here (measured for the CNN's first layer, 2 threads).
        if g == 1:
            dwt = torch.bmm(cols, dout.reshape(n, o, p).transpose(1, 2)).sum(0)  # (C_in kH kW, C_out)
            return dwt.t().view(o, c, kh, kw)  # a view (not contiguous)
        dwt = torch.matmul(cols.view(n, g, -1, p), dout.reshape(n, g, o // g, p).transpose(2, 3)).sum(0)
        return dwt.transpose(1, 2).reshape(o, c // g, kh, kw)  # (G, C_in/G kH kW, C_out/G) -> dw
