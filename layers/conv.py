"""Conv2d: 2-d convolution whose backward is written out by hand, in its im2col form.

Shape legend (see layers/layer.py): N = batch, C_in / C_out = input / output channels, G = groups,
(H, W) = input height and width, (H_out, W_out) = output height and width, (kH, kW) = kernel size,
(sH, sW) = stride, (pH, pW) = padding, (dH, dW) = dilation.  Per spatial axis (rows shown):

    H_out = floor((H + 2 pH - dH (kH - 1) - 1) / sH) + 1

im2col (CS231n's vectorised convolution): ``F.unfold`` copies every receptive field of the padded input into a
column, cols (N, C_in, kH, kW, H_out, W_out): cols[:, :, i, j] -- the "patch" of kernel offset (i, j) -- is what
every output position sees through tap (i, j), whatever the stride and dilation.  The forward is then, per group,

    out[n, o, h, w] = b[o] + sum_{c, i, j} weight[o, c, i, j] * cols[n, c, i, j, h, w]

a product of the weight with the columns; so, offset by offset (the exercise's loop, learn/exercises/conv2d.py),

    dweight[:, :, i, j] = sum_{n, h, w} dout[n, o, h, w] patch[n, c, h, w]       one weight is used everywhere
    dcols[:, :, i, j]   = sum_o dout[n, o, h, w] weight[o, c, i, j]              each column receives its outputs'
    dx = F.fold(dcols)                                                          col2im: a pixel in several
                                                                                windows receives the sum
    dbias = dout summed over (n, h, w)

``conv2d_backward`` below.  The kernels (kernels/convolution.py) compute the same sums through the convolution
primitives: dx as a transposed convolution of dout with the weight, dweight as a correlation of the input with
dout in the form that suits the layer's shape.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

import kernels
from kernels import convolution

from .checks import Expects, check_bool, check_int, is_a
from .init import torch_default_params
from .layer import BaseLayer, learned


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
    with ``need_input_grad=False``: the first layer of a network skips it, in the kernel).
    Kept between the two: the (padded) input, for dw, and the weight, for dx; changing either in place in
    between (an optimizer step before backward) is refused, as torch.autograd refuses it (layers/saved.py).
    Written in the template (layers/template.py): the base checks, keeps, versions and accumulates.
    """

    _param_names = ("weight", "bias")
    expects = Expects(
        dims=(3, 4),
        size=(-3, "in_channels"),
        like=("weight",),
        like_name="input",
        floating=False,
        shape="(N, {in_channels}, H, W) or, unbatched, ({in_channels}, H, W)",
    )
    torch_class = torch.nn.Conv2d
    _ctor_args = (
        "in_channels",
        "out_channels",
        "kernel_size",
        "stride",
        "padding",
        "dilation",
        "groups",
        "bias",
        "padding_mode",
    )

    class Saved(NamedTuple):
        x: Tensor  # (N, C_in, H', W') the input as convolved (with the extra "same" row/column), for dw
        weight: Tensor  # (C_out, C_in / G, kH, kW), for dx
        hw: tuple[int, int]  # the input's (H, W): dx is cut back to it
        unbatched: bool  # the input was (C_in, H, W): dout and dx lose the batch axis of one

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        owner = "Conv2d"
        self.in_channels = check_int(owner, "in_channels", in_channels)
        self.out_channels = check_int(owner, "out_channels", out_channels)
        self.groups = check_int(owner, "groups", groups)
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"{owner}: in_channels ({in_channels}) and out_channels ({out_channels}) must both be "
                f"divisible by groups ({groups})"
            )
        self.kernel_size = pair(owner, "kernel_size", kernel_size, 1)
        self.stride = pair(owner, "stride", stride, 1)
        self.dilation = pair(owner, "dilation", dilation, 1)
        check_bool(owner, "bias", bias)
        if padding_mode != "zeros":
            raise ValueError(
                f"{owner}: padding_mode must be 'zeros' (reflect, replicate and circular padding are "
                f"not supported), got {padding_mode!r}"
            )
        self.padding_mode = padding_mode
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"{owner}: dtype must be floating point, got {dtype}")
        (kh, kw), (dh, dw) = self.kernel_size, self.dilation
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(
                    f"{owner}: padding must be 'same', 'valid', an int >= 0 or a pair of them, got {padding!r}"
                )
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
        self.weight, self.bias = learned(
            *torch_default_params((out_channels, in_channels // groups, kh, kw), bias, device=device, dtype=dtype)
        )

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
            span = tuple(d * (k - 1) + 1 for k, d in zip(self.kernel_size, self.dilation, strict=True))
            raise ValueError(
                f"{self!r}: input of spatial size {hw} (padding {self._pad}) is smaller than the dilated kernel {span}"
            )
        out = F.conv2d(x, self.weight, self.bias, self.stride, self._pad, self.dilation, self.groups)
        out = out.squeeze(0) if unbatched else out  # (N, C_out, H_out, W_out) or (C_out, H_out, W_out)
        return out, self.Saved(x, self.weight, hw, unbatched)

    def backward_math(self, dout: Tensor, saved: Saved):
        """dout: (N, C_out, H_out, W_out) -> dx: (N, C_in, H, W); dweight (C_out, C_in / G, kH, kW) and dbias (C_out,),
        added into weight.grad and bias.grad.  Unbatched: dout (C_out, H_out, W_out) -> dx (C_in, H, W)."""
        x, weight, (h, w) = saved.x, saved.weight, saved.hw
        dout = dout.unsqueeze(0) if saved.unbatched else dout  # (N, C_out, H_out, W_out)
        if kernels.enabled():  # a transposed convolution and a correlation: kernels/convolution.py
            dx, dweight, dbias = self._kernel_backward(x, weight, dout)
        else:
            dx, dweight, dbias = conv2d_backward(dout, x, weight, self.stride, self._pad, self.dilation, self.groups)
        if dx is not None:
            dx = dx[:, :, :h, :w]  # (N, C_in, H, W): without the extra "same" row/column
            dx = dx.squeeze(0) if saved.unbatched else dx
        return dx, {"weight": dweight, "bias": dbias}

    def _kernel_backward(self, x: Tensor, weight: Tensor, dout: Tensor):
        """(dx or None, dweight, dbias) through the convolution primitives; dweight and dbias as callables,
        computed only for a parameter that wants one (a frozen one costs nothing)."""
        dx = None
        if self.needs_input_grad:
            dx = convolution.input_grad(dout, weight, x.shape, self.stride, self._pad, self.dilation, self.groups)

        def dweight() -> Tensor:
            if x.shape[0] == 0:  # an empty batch: nothing to sum (the correlation has no channels to run on)
                return weight.new_zeros(weight.shape)
            dw = convolution.weight_grad(x, dout, self.kernel_size, self.stride, self._pad, self.dilation, self.groups)
            return dw if self.weight.grad is not None else dw.contiguous()  # into .grad from the view; or .grad

        return dx, dweight, lambda: dout.sum((0, 2, 3))


def conv2d_backward(
    dout: Tensor,
    x: Tensor,
    weight: Tensor,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The im2col backward (the module docstring): dout (N, C_out, H_out, W_out), x (N, C_in, H, W), weight
    (C_out, C_in / G, kH, kW) -> (dx (N, C_in, H, W), dweight, dbias (C_out,)).  Each group is a convolution of its
    own channels."""
    n, c_in, h, w = x.shape
    c_out, cg, kh, kw = weight.shape
    og = c_out // groups
    ho, wo = dout.shape[2:]
    cols = F.unfold(x, (kh, kw), dilation, padding, stride).view(n, c_in, kh, kw, ho, wo)  # im2col
    dcols_of, dweight = [], []  # per group
    for g in range(groups):
        dcols_g, dweight_g = _offsets_backward(
            dout[:, g * og : (g + 1) * og], cols[:, g * cg : (g + 1) * cg], weight[g * og : (g + 1) * og]
        )
        dcols_of.append(dcols_g)
        dweight.append(dweight_g)
    dcols = torch.cat(dcols_of, 1).view(n, c_in * kh * kw, ho * wo)  # (N, C_in kH kW, H_out W_out)
    dx = F.fold(dcols, (h, w), (kh, kw), dilation, padding, stride)  # col2im: overlapping windows add up
    dbias = dout.sum((0, 2, 3))  # (C_out,)
    return dx, torch.cat(dweight), dbias


def _offsets_backward(dout: Tensor, cols: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """One group: dout (N, O, H_out, W_out), cols (N, C, kH, kW, H_out, W_out), weight (O, C, kH, kW) -> (dcols,
    dweight), kernel offset by kernel offset, as the exercise writes it."""
    kh, kw = weight.shape[2:]
    dcols = torch.zeros_like(cols)  # (N, C, kH, kW, H_out, W_out)
    dweight = torch.zeros_like(weight)  # (O, C, kH, kW)
    for i in range(kh):
        for j in range(kw):
            patch = cols[:, :, i, j]  # (N, C, H_out, W_out): what each output sees at offset (i, j)
            dweight[:, :, i, j] = torch.einsum("nohw,nchw->oc", dout, patch)
            dcols[:, :, i, j] = torch.einsum("nohw,oc->nchw", dout, weight[:, :, i, j])
    return dcols, dweight
