"""Exercise linear_split: split Linear's backward in two, B (the input gradient, now) and W (the weight gradients,
later), as a zero-bubble pipeline runs it.

Shapes (N = batch size, D = in_features, H = out_features), as in exercise linear:
    x (N, D) -> out = x @ weight^T + bias (N, H);  weight (H, D), bias (H,)
In a pipeline the stage before waits for dx, and for nothing else: so B computes dx alone and returns it at
once, keeping what W will need; W runs later (in what would have been a bubble) and adds dweight and dbias
into .grad.  Zero Bubble Pipeline Parallelism (Qi et al. 2023) calls them B and W.
    B: backward_input(dout) -> dx (N, D).  .grad is W's business: B leaves it alone
    W: backward_weight()     adds dweight (H, D) and dbias (H,) into .grad, from what B kept
The caller may reuse dout's memory for the next micro-batch once B has returned (a pipeline receives each
micro-batch's gradient into the same buffer), so B must keep its own copy of what W reads.  One W per B:
W uses up what B kept; a W with no B before it adds nothing.  B then W runs the fused backward's own
operations on the same tensors, so together they equal backward() bit for bit.
{check}
"""
import torch


class Linear:
    def __init__(self, in_features, out_features):
        self.in_features, self.out_features = in_features, out_features
        bound = in_features ** -0.5  # nn.Linear's initialisation: uniform in [-bound, bound]
        self.weight = (2 * torch.rand(out_features, in_features, dtype=torch.float64) - 1) * bound  # (H, D)
        self.bias = (2 * torch.rand(out_features, dtype=torch.float64) - 1) * bound  # (H,)
        self.pending = None  # what B kept for W: None when no W is due

    def parameters(self):
        return [self.weight, self.bias]

    def forward(self, x):
        """x (N, D) -> out (N, H) = x @ weight^T + bias.  Given."""
        self.x = x  # (N, D): dweight needs it
        return x @ self.weight.T + self.bias  # (N, H)

    def backward(self, dout):
        """The fused backward, B and W in one (exercise linear's).  Given: the split must equal it bit for bit."""
        dx = dout @ self.weight  # (N, D)
        for p, g in ((self.weight, dout.T @ self.x), (self.bias, dout.sum(0))):  # (H, D), (H,)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad += g
        return dx

    def backward_input(self, dout):
        """B: dout (N, H) -> dx (N, D), now; keeps in self.pending what backward_weight will need."""
        # TODO: dx as the fused backward computes it; keep what W reads (your own copy of dout: the caller
        #       may overwrite its dout before W runs).  Leave .grad alone.
        ### BEGIN SOLUTION
        self.pending = dout.clone()  # (N, H): W's input; a copy, for the caller may reuse dout's memory
        dx = dout @ self.weight  # (N, D): all the stage before waits for
        ### END SOLUTION
        return dx

    def backward_weight(self):
        """W: adds dweight (H, D) and dbias (H,) into weight.grad and bias.grad, from what backward_input kept."""
        # TODO: nothing to do when no B is pending; else the fused backward's dweight and dbias from the kept
        #       dout and self.x, added into .grad (created as zeros when None); then forget the kept dout.
        ### BEGIN SOLUTION
        if self.pending is None:
            return  # one W per B: this B's gradients are in .grad already
        dout, self.pending = self.pending, None
        dweight, dbias = dout.T @ self.x, dout.sum(0)  # (H, D), (H,): the fused backward's own operations
        for p, g in ((self.weight, dweight), (self.bias, dbias)):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad += g  # accumulate: the micro-batches' W passes add up
        ### END SOLUTION
