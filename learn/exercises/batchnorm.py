"""Exercise batchnorm: write BatchNorm1d in training mode (nn.BatchNorm1d's, eps 1e-5; no running statistics).

Shapes (N = batch size, D = features):
    x (N, D) -> out (N, D);  weight (D,) = gamma, bias (D,) = beta
    mean = x.mean(0) (D,);  var = ((x - mean)^2).mean(0) (D,), the biased variance (divided by N), which is
    what PyTorch normalises with;  xhat = (x - mean) / sqrt(var + eps);  out = weight * xhat + bias

The catch: mean and var are computed from every x of the column, so each x[n, d] reaches the output
three ways (directly, through the mean, through the variance), and dx has three terms.
{check}
"""
import torch


class BatchNorm1d:
    def __init__(self, num_features, eps=1e-5):
        self.eps = eps
        self.weight = torch.ones(num_features, dtype=torch.float64)  # (D,) gamma
        self.bias = torch.zeros(num_features, dtype=torch.float64)  # (D,) beta

    def parameters(self):
        return [self.weight, self.bias]

    def forward(self, x):
        """x (N, D) -> out (N, D), each column normalised over the batch, then scaled and shifted."""
        # TODO: mean (D,), biased var (D,), xhat (N, D), out (N, D) as above; keep what backward needs.
        ### BEGIN SOLUTION
        mean = x.mean(0)  # (D,)
        var = ((x - mean) ** 2).mean(0)  # (D,) biased: divided by N
        self.rstd = 1 / torch.sqrt(var + self.eps)  # (D,)
        self.xhat = (x - mean) * self.rstd  # (N, D)
        out = self.weight * self.xhat + self.bias  # (N, D)
        ### END SOLUTION
        return out

    def backward(self, dout):
        """dout (N, D) -> dx (N, D); adds dweight (D,) and dbias (D,) into weight.grad and bias.grad."""
        # TODO: dweight (D,) and dbias (D,): each sums over the batch; dx (N, D): through xhat, whose mean and
        #       variance depend on the whole column.  Add the parameter gradients into .grad (create .grad
        #       when it is None); return dx.
        # (Optional: record intermediates as self.saved = {"name": tensor}, names among mean, var, rstd, xhat, dxhat;
        #  the check compares each with autograd's, exact or not.)
        ### BEGIN SOLUTION
        n = dout.shape[0]
        dweight = (dout * self.xhat).sum(0)  # (D,)
        dbias = dout.sum(0)  # (D,)
        dxhat = dout * self.weight  # (N, D)
        # x reaches xhat directly, through the mean and through the variance: one term each
        dx = self.rstd / n * (n * dxhat - dxhat.sum(0) - self.xhat * (dxhat * self.xhat).sum(0))  # (N, D)
        for p, g in ((self.weight, dweight), (self.bias, dbias)):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad += g
        ### END SOLUTION
        return dx
