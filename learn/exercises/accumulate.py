"""Exercise accumulate: gradient accumulation and zero_grad: one batch's gradient, computed in micro-batches.

A backward adds into .grad (+=), it never replaces it.  That is why a batch too big for one pass can be split
into micro-batches whose gradients add up to the whole batch's, and why a second backward without zero_grad
between them doubles what a single one gives (the optimizer would step twice as far).

Accumulate is a linear model (the Linear below, given) with the loss L = mean((x W^T + b - target)^2) over all
N * H elements of a batch.  x (N, D), target (N, H); weight (H, D), bias (H,).  forward_backward runs the batch
micro_batch rows at a time (the last micro-batch may be shorter) and must leave in .grad exactly the gradient
of the whole batch's L: each micro-batch's share of the mean is its squared errors divided by N * H, the whole
batch's count, not by its own.
{check}
"""
import torch


class Linear:
    """Given: out = x @ weight^T + bias; backward adds into .grad, as the exercise linear does."""

    def __init__(self, in_features, out_features):
        bound = in_features ** -0.5
        self.weight = (2 * torch.rand(out_features, in_features, dtype=torch.float64) - 1) * bound  # (H, D)
        self.bias = (2 * torch.rand(out_features, dtype=torch.float64) - 1) * bound  # (H,)

    def forward(self, x):
        self.x = x  # (m, D)
        return x @ self.weight.T + self.bias  # (m, H)

    def backward(self, dout):
        dx = dout @ self.weight  # (m, D)
        dweight = dout.T @ self.x  # (H, D)
        dbias = dout.sum(0)  # (H,)
        for p, g in ((self.weight, dweight), (self.bias, dbias)):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad += g
        return dx


class Accumulate:
    def __init__(self, in_features, out_features, micro_batch):
        self.layer = Linear(in_features, out_features)
        self.weight, self.bias = self.layer.weight, self.layer.bias  # the parameters (the same tensors)
        self.micro_batch = micro_batch  # rows per pass

    def parameters(self):
        return [self.weight, self.bias]

    def zero_grad(self):
        """Clear every parameter's gradient, before the next batch's is accumulated."""
        # TODO: after it, no .grad holds anything (None, as torch's zero_grad leaves it, or zeros).
        ### BEGIN SOLUTION
        for p in self.parameters():
            p.grad = None
        ### END SOLUTION

    def forward_backward(self, x, target):
        """x (N, D), target (N, H) -> the batch's loss (0-d); adds the batch's gradient into .grad."""
        # TODO: for each micro-batch of micro_batch rows: forward through self.layer, its squared errors, and
        #       backward with its share of the whole batch's mean (2 * diff / (N * H)).  Do not clear .grad here:
        #       a second call adds, as any backward does; zero_grad is the caller's.  Return the batch's loss.
        ### BEGIN SOLUTION
        count = target.numel()  # N * H: the whole batch's mean divides by it
        total = torch.zeros((), dtype=x.dtype)
        for start in range(0, len(x), self.micro_batch):
            xb, tb = x[start:start + self.micro_batch], target[start:start + self.micro_batch]  # (m, D), (m, H)
            diff = self.layer.forward(xb) - tb  # (m, H)
            total = total + (diff ** 2).sum()
            self.layer.backward(2 * diff / count)  # this micro-batch's share of the batch's gradient, +=
        loss = total / count
        ### END SOLUTION
        return loss
