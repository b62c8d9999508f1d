"""The checks of exercise conv2d: Conv2d(2, 3, 3, padding=1) on x (2, 2, 5, 6), other kernels and paddings
(0, 1, 2), and its known mistakes."""

import torch
import torch.nn.functional as F

from ..spec import LayerSpec, normal, uniform, wrong

K = 3


def _dx_assigned(c):
    """The learner's loop over kernel offsets with = where += belongs: each pixel keeps the last offset's share."""
    k, p = c.kernel_size, c.padding
    ho, wo = c.dout.shape[2:]
    h, w = c.x.shape[2:]
    dxp = torch.zeros(c.x.shape[0], c.x.shape[1], h + 2 * p, w + 2 * p, dtype=c.x.dtype)
    for i in range(k):
        for j in range(k):
            dxp[:, :, i : i + ho, j : j + wo] = torch.einsum("nohw,oc->nchw", c.dout, c.weight[:, :, i, j])
    return dxp[:, :, p : p + h, p : p + w]


def _dx_padded(c):
    return F.conv_transpose2d(c.dout, c.weight)  # (N, C_in, H + 2P, W + 2P): the padding not cut off


def _shaped(label, n, cin, cout, k, p, h, w):
    return {
        "label": label,
        "ctor": {"in_channels": cin, "out_channels": cout, "kernel_size": k, "padding": p},
        "params": {"weight": lambda g: uniform(g, cout, cin, k, k), "bias": lambda g: normal(g, cout, mean=0.5)},
        "inputs": lambda g: {"x": normal(g, n, cin, h, w)},
    }


def _random(g):
    n, cin, cout, k = (int(v) for v in torch.randint(1, 4, (4,), generator=g))
    p = int(torch.randint(0, 3, (), generator=g))
    h, w = (int(v) for v in torch.randint(k, k + 5, (2,), generator=g))
    return _shaped(
        f"N = {n}, C_in = {cin}, C_out = {cout}, k = {k}, p = {p}, H x W = {h} x {w}", n, cin, cout, k, p, h, w
    )


SPEC = LayerSpec(
    name="conv2d",
    cls="Conv2d",
    ctor={"in_channels": 2, "out_channels": 3, "kernel_size": K, "padding": 1},
    params={"weight": lambda g: uniform(g, 3, 2, K, K), "bias": lambda g: normal(g, 3, mean=0.5)},
    inputs=lambda g: {"x": normal(g, 2, 2, 5, 6)},
    reference=lambda t: {"out": F.conv2d(t.x, t.weight, t.bias, padding=t.padding)},
    configs=[
        _shaped("padding 0", 2, 2, 3, 3, 0, 5, 6),
        _shaped("padding 2, one example (N = 1)", 1, 2, 3, 3, 2, 4, 5),
        _shaped("a 1 x 1 kernel, padding 0", 2, 3, 2, 1, 0, 3, 4),
        _shaped("an even kernel (k = 2), padding 1, one channel in", 2, 1, 2, 2, 1, 4, 3),
    ],
    random=_random,
    mistakes=[
        wrong(
            "conv-dx-flipped",
            "dx",
            "dout through the kernel flipped, weight[:, :, k-1-i, k-1-j]",
            "in this loop form no flip is needed: the pixel seen at offset (i, j) gets dout through weight[:, :, "
            "i, j] itself (the flip appears only when dx is written as a convolution of dout)",
            lambda c: F.conv_transpose2d(c.dout, c.weight.flip(2, 3), padding=c.padding),
        ),
        wrong(
            "conv-dx-overlap-assigned",
            "dx",
            "dxp[...] = ... for each kernel offset",
            "a pixel is seen by several outputs, at different offsets, and receives the sum of their shares: "
            "dxp[:, :, i:i + H_out, j:j + W_out] += ..., not =",
            _dx_assigned,
        ),
        wrong(
            "conv-dx-padding-kept",
            "dx",
            "the gradient of the padded input, (N, C_in, H + 2p, W + 2p)",
            "the padding is not an input: cut it off, dx = dxp[:, :, p:p + H, p:p + W]",
            _dx_padded,
        ),
        wrong(
            "conv-dweight-flipped",
            "weight.grad",
            "the right gradient with the kernel flipped",
            "dweight[:, :, i, j] belongs to the offset (i, j) at which weight[:, :, i, j] was used",
            lambda c: c.expected["weight.grad"].flip(2, 3),
        ),
        wrong(
            "conv-dbias-per-position",
            "bias.grad",
            "dout.sum(0), of shape (C_out, H_out, W_out)",
            "one bias per output channel is added at every position of every example: dout.sum((0, 2, 3))",
            lambda c: c.dout.sum(0),
        ),
        wrong(
            "conv-dweight-offsets-swapped",
            "weight.grad",
            "dweight[:, :, j, i] for the offset (i, j)",
            "the offset (i, j) is row i, column j of the kernel: its gradient goes into dweight[:, :, i, j]",
            lambda c: c.expected["weight.grad"].transpose(2, 3),
        ),
        wrong(
            "conv-dx-cropped-one-side",
            "dx",
            "dxp[:, :, p:, p:], the padding cut on one side only",
            "dxp is padded on both sides, (H + 2p, W + 2p): dx = dxp[:, :, p:p + H, p:p + W], with H = "
            "dxp.shape[2] - 2 * p",
            lambda c: _dx_padded(c)[:, :, c.padding :, c.padding :],
        ),
        wrong(
            "conv-dbias-mean",
            "bias.grad",
            "dout.mean((0, 2, 3))",
            "the bias is added at every position of every example, so its gradient is the *sum* over them: "
            "dout.sum((0, 2, 3))",
            lambda c: c.dout.mean((0, 2, 3)),
        ),
    ],
    where={
        "dx": "the share of dxp at each offset's place, += (then the padding cut off)",
        "weight.grad": "dweight[:, :, i, j] = einsum('nohw,nchw->oc', dout, patch at (i, j))",
        "bias.grad": "dbias = dout.sum((0, 2, 3))",
    },
)
