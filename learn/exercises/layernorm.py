"""Exercise layernorm: write LayerNorm over the last axis of (N, D) rows (nn.LayerNorm(D)'s, eps 1e-5).

Shapes (N = batch size, D = features):
    x (N, D) -> out (N, D);  weight (D,) = gamma, bias (D,) = beta
    per row: mean (N, 1), var (N, 1) the biased variance over the row's D features;
    xhat = (x - mean) / sqrt(var + eps) (N, D);  out = weight * xhat + bias

Batch norm's algebra turned sideways: the statistics are taken over a row, but weight and bias are shared
by every row, so their gradients still sum over the batch.
{check}
"""
import torch


class LayerNorm:
    def __init__(self, normalized_shape, eps=1e-5):
        self.eps = eps
        self.weight = torch.ones(normalized_shape, dtype=torch.float64)  # (D,) gamma
        self.bias = torch.zeros(normalized_shape, dtype=torch.float64)  # (D,) beta

    def parameters(self):
        return [self.weight, self.bias]

    def forward(self, x):
        """x (N, D) -> out (N, D), each row normalised over its features, then scaled and shifted."""
        # TODO: mean and biased var of each row (keepdim=True: (N, 1)), xhat (N, D), out (N, D); keep what
        #       backward needs.
        ### BEGIN SOLUTION
        mean = x.mean(1, keepdim=True)  # (N, 1)
        var = ((x - mean) ** 2).mean(1, keepdim=True)  # (N, 1) biased
        self.rstd = 1 / torch.sqrt(var + self.eps)  # (N, 1)
        self.xhat = (x - mean) * self.rstd  # (N, D)
        out = self.weight * self.xhat + self.bias  # (N, D)
        ### END SOLUTION
        return out

    def backward(self, dout):
        """dout (N, D) -> dx (N, D); adds dweight (D,) and dbias (D,) into weight.grad and bias.grad."""
        # TODO: dweight (D,), dbias (D,) -- which axis do they sum over? --; dx (N, D) through xhat, whose
        #       statistics depend on the whole row.  Add into .grad (create it when None); return dx.
        # (Optional: record intermediates as self.saved = {"name": tensor}, names among mean, var, rstd, xhat, dxhat;
        #  the check compares each with autograd's, exact or not.)
        ### BEGIN SOLUTION
        d = dout.shape[1]
        dweight = (dout * self.xhat).sum(0)  # (D,): weight is shared by every row
        dbias = dout.sum(0)  # (D,)
        dxhat = dout * self.weight  # (N, D)
        dx = self.rstd / d * (d * dxhat - dxhat.sum(1, keepdim=True)
                              - self.xhat * (dxhat * self.xhat).sum(1, keepdim=True))  # (N, D)
        for p, g in ((self.weight, dweight), (self.bias, dbias)):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad += g
        ### END SOLUTION
        return dx
