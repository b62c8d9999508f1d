"""Exercise linear: write Linear, the affine layer out = x @ weight^T + bias (nn.Linear's).

Shapes (N = batch size, D = in_features, H = out_features):
    x (N, D) -> out (N, H)
    weight (H, D): one row of weights per output, as nn.Linear stores it
    bias (H,): added to every row of the batch

The chain rule on out[n, h] = sum_d x[n, d] weight[h, d] + bias[h]: each of x, weight and bias is
used by several outputs, and its gradient is the sum over them.
{check}
"""
import torch


class Linear:
    def __init__(self, in_features, out_features):
        self.in_features, self.out_features = in_features, out_features
        bound = in_features ** -0.5  # nn.Linear's initialisation: uniform in [-bound, bound]
        self.weight = (2 * torch.rand(out_features, in_features, dtype=torch.float64) - 1) * bound  # (H, D)
        self.bias = (2 * torch.rand(out_features, dtype=torch.float64) - 1) * bound  # (H,)

    def parameters(self):
        return [self.weight, self.bias]

    def forward(self, x):
        """x (N, D) -> out (N, H) = x @ weight^T + bias."""
        # TODO: compute out (N, H), and keep on self what backward will need (the input x).
        ### BEGIN SOLUTION
        self.x = x  # (N, D): dweight needs it
        out = x @ self.weight.T + self.bias  # (N, H)
        ### END SOLUTION
        return out

    def backward(self, dout):
        """dout = dL/dout (N, H) -> dx = dL/dx (N, D); adds dL/dweight (H, D) into weight.grad, dL/dbias (H,)
        into bias.grad."""
        # TODO: from dout (N, H), self.x (N, D) and self.weight (H, D) compute
        #         dx (N, D), dweight (H, D) -- the shape of weight --, dbias (H,) -- the shape of bias;
        #       add dweight into self.weight.grad and dbias into self.bias.grad: when .grad is None create
        #       it first (p.grad = torch.zeros_like(p)), then p.grad += ...; return dx.
        ### BEGIN SOLUTION
        dx = dout @ self.weight  # (N, D): dx[n, d] = sum_h dout[n, h] weight[h, d]
        dweight = dout.T @ self.x  # (H, D): dweight[h, d] = sum_n dout[n, h] x[n, d], a sum over the batch
        dbias = dout.sum(0)  # (H,): the bias is added to every row, so its gradient sums over the batch
        for p, g in ((self.weight, dweight), (self.bias, dbias)):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad += g  # accumulate, as PyTorch does
        ### END SOLUTION
        return dx
