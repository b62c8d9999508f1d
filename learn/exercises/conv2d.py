"""Exercise conv2d: write Conv2d's backward, stride 1 with zero padding (nn.Conv2d's; the forward is given).

Shapes (N = batch size, C_in/C_out = channels, k = kernel size, p = padding):
    x (N, C_in, H, W) -> out (N, C_out, H_out, W_out), H_out = H + 2p - k + 1, W_out = W + 2p - k + 1
    weight (C_out, C_in, k, k), bias (C_out,)
The forward loops over the k * k kernel offsets (i, j): at each, every output position adds the
weight[:, :, i, j]-weighted channels of the input pixel it sees there.  So one weight is used at every
position of every example (its gradient sums over all of them), and one input pixel is seen by several
outputs, at different offsets (its gradient sums over those).
{check}
"""
import torch


class Conv2d:
    def __init__(self, in_channels, out_channels, kernel_size, padding=0):
        self.kernel_size, self.padding = kernel_size, padding
        bound = (in_channels * kernel_size ** 2) ** -0.5  # nn.Conv2d's initialisation
        self.weight = (2 * torch.rand(out_channels, in_channels, kernel_size, kernel_size,
                                      dtype=torch.float64) - 1) * bound  # (C_out, C_in, k, k)
        self.bias = (2 * torch.rand(out_channels, dtype=torch.float64) - 1) * bound  # (C_out,)

    def parameters(self):
        return [self.weight, self.bias]

    def forward(self, x):
        """x (N, C_in, H, W) -> out (N, C_out, H_out, W_out).  Given."""
        k, p = self.kernel_size, self.padding
        xp = torch.nn.functional.pad(x, (p, p, p, p))  # (N, C_in, H + 2p, W + 2p), zeros around
        n, _, hp, wp = xp.shape
        ho, wo = hp - k + 1, wp - k + 1
        out = self.bias.view(1, -1, 1, 1).repeat(n, 1, ho, wo)  # (N, C_out, H_out, W_out)
        for i in range(k):
            for j in range(k):
                patch = xp[:, :, i:i + ho, j:j + wo]  # (N, C_in, H_out, W_out): what each output sees at (i, j)
                out += torch.einsum("nchw,oc->nohw", patch, self.weight[:, :, i, j])
        self.xp = xp  # the padded input: dweight needs it
        return out

    def backward(self, dout):
        """dout (N, C_out, H_out, W_out) -> dx (N, C_in, H, W); adds dweight (C_out, C_in, k, k) and dbias
        (C_out,) into weight.grad and bias.grad."""
        # TODO: walk the forward's loop again.  At offset (i, j), out += patch . weight[:, :, i, j] gives
        #         dweight[:, :, i, j] (C_out, C_in): dout against patch, summed over the batch and positions;
        #         a share of dxp (N, C_in, H + 2p, W + 2p) at the patch's place: dout through weight[:, :, i, j].
        #       The places of different offsets overlap: add, don't assign.  Then dx = dxp without its
        #       padding, dbias (C_out,) = dout summed over everything but the channel.  Add into .grad.
        # (Optional: record intermediates as self.saved = {"name": tensor}, names among xp, dxp;
        #  the check compares each with autograd's, exact or not.)
        ### BEGIN SOLUTION
        k, p = self.kernel_size, self.padding
        ho, wo = dout.shape[2:]
        dxp = torch.zeros_like(self.xp)  # (N, C_in, H + 2p, W + 2p)
        dweight = torch.zeros_like(self.weight)  # (C_out, C_in, k, k)
        for i in range(k):
            for j in range(k):
                patch = self.xp[:, :, i:i + ho, j:j + wo]  # (N, C_in, H_out, W_out)
                dweight[:, :, i, j] = torch.einsum("nohw,nchw->oc", dout, patch)
                dxp[:, :, i:i + ho, j:j + wo] += torch.einsum("nohw,oc->nchw", dout, self.weight[:, :, i, j])
        h, w = dxp.shape[2] - 2 * p, dxp.shape[3] - 2 * p
        dx = dxp[:, :, p:p + h, p:p + w]  # (N, C_in, H, W): the padding is not an input
        dbias = dout.sum((0, 2, 3))  # (C_out,)
        for param, g in ((self.weight, dweight), (self.bias, dbias)):
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            param.grad += g
        ### END SOLUTION
        return dx
