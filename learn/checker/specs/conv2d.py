"""The checks of exercise conv2d: Conv2d(2, 3, 3, padding=1) on x (2, 2, 5, 6), and its known mistakes."""
import torch
import torch.nn.functional as F

from ..spec import LayerSpec, normal, uniform, wrong

K, P = 3, 1


def _dx_assigned(c):
    """The learner's loop over kernel offsets with = where += belongs: each pixel keeps the last offset's share."""
    ho, wo = c.dout.shape[2:]
    dxp = torch.zeros(c.x.shape[0], c.x.shape[1], c.x.shape[2] + 2 * P, c.x.shape[3] + 2 * P, dtype=c.x.dtype)
    for i in range(K):
        for j in range(K):
            dxp[:, :, i:i + ho, j:j + wo] = torch.einsum("nohw,oc->nchw", c.dout, c.weight[:, :, i, j])
    return dxp[:, :, P:-P, P:-P]


def _dx_padded(c):
    return F.conv_transpose2d(c.dout, c.weight)  # (N, C_in, H + 2P, W + 2P): the padding not cut off


SPEC = LayerSpec(
    name="conv2d", cls="Conv2d", ctor={"in_channels": 2, "out_channels": 3, "kernel_size": K, "padding": P},
    params={"weight": lambda g: uniform(g, 3, 2, K, K), "bias": lambda g: normal(g, 3, mean=0.5)},
    inputs=lambda g: {"x": normal(g, 2, 2, 5, 6)},
    reference=lambda t: {"out": F.conv2d(t.x, t.weight, t.bias, padding=P)},
    mistakes=[
        wrong("conv-dx-flipped", "dx", "dout through the kernel flipped, weight[:, :, k-1-i, k-1-j]",
              "in this loop form no flip is needed: the pixel seen at offset (i, j) gets dout through weight[:, :, "
              "i, j] itself (the flip appears only when dx is written as a convolution of dout)",
              lambda c: F.conv_transpose2d(c.dout, c.weight.flip(2, 3), padding=P)),
        wrong("conv-dx-overlap-assigned", "dx", "dxp[...] = ... for each kernel offset",
              "a pixel is seen by several outputs, at different offsets, and receives the sum of their shares: "
              "dxp[:, :, i:i + H_out, j:j + W_out] += ..., not =", _dx_assigned),
        wrong("conv-dx-padding-kept", "dx", "the gradient of the padded input, (N, C_in, H + 2p, W + 2p)",
              "the padding is not an input: cut it off, dx = dxp[:, :, p:p + H, p:p + W]", _dx_padded),
        wrong("conv-dweight-flipped", "weight.grad", "the right gradient with the kernel flipped",
              "dweight[:, :, i, j] belongs to the offset (i, j) at which weight[:, :, i, j] was used",
              lambda c: c.expected["weight.grad"].flip(2, 3)),
        wrong("conv-dbias-per-position", "bias.grad", "dout.sum(0), of shape (C_out, H_out, W_out)",
              "one bias per output channel is added at every position of every example: dout.sum((0, 2, 3))",
              lambda c: c.dout.sum(0)),
    ],
    where={"dx": "the share of dxp at each offset's place, += (then the padding cut off)",
           "weight.grad": "dweight[:, :, i, j] = einsum('nohw,nchw->oc', dout, patch at (i, j))",
           "bias.grad": "dbias = dout.sum((0, 2, 3))"},
)
