"""Exercise dropout: write Dropout, inverted dropout as nn.Dropout does it in training.

Shapes: x (any shape) -> out (the same shape); backward: dout (that shape) -> dx (that shape).

p is the probability of DROPPING an element (torch's meaning; CS231n's p is of keeping).  Each element of x is
kept with probability 1 - p, and the kept ones are scaled by 1 / (1 - p), so that out's expected value is x:
at test time (eval) the layer is the identity.  The mask is random, so the backward must use the very mask the
forward drew.  The draws come from the layer's own generator (seeded): the check replays them.
{check}
"""
import torch


class Dropout:
    def __init__(self, p=0.5, seed=0):
        self.p = p  # the probability of dropping an element
        self.generator = torch.Generator().manual_seed(seed)  # the masks are drawn from it
        self.training = True

    def parameters(self):
        return []

    def forward(self, x):
        """x -> out, the same shape."""
        if not self.training or self.p == 0:  # given: the identity, nothing drawn
            self.mask = None
            return x
        keep = torch.empty_like(x).bernoulli_(1 - self.p, generator=self.generator)  # given: 1 kept, 0 dropped
        # TODO: the mask this forward applies: keep scaled by 1 / (1 - p) (and with p = 1, when every element is
        #       dropped, zeros: 1 / (1 - p) would be 1/0); keep it for backward; out = x times it.
        ### BEGIN SOLUTION
        self.mask = keep / (1 - self.p) if self.p < 1 else torch.zeros_like(x)  # (x's shape) 0 or 1/(1-p)
        out = x * self.mask
        ### END SOLUTION
        return out

    def backward(self, dout):
        """dout = dL/dout -> dx = dL/dx, the same shape."""
        # TODO: dx: out = x * mask element by element, with the forward's mask (None: the forward was the
        #       identity).
        ### BEGIN SOLUTION
        dx = dout if self.mask is None else dout * self.mask
        ### END SOLUTION
        return dx
