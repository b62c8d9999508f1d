"""Exercise relu: write ReLU, out = max(x, 0) elementwise.

Shapes: x (any shape) -> out (the same shape); backward: dout (that shape) -> dx (that shape).

ReLU is a gate: where the input was positive the output is the input, so the local derivative is 1 and
the gradient passes; where it was not, the output is a constant 0 and the gradient stops.  (At exactly 0,
take the derivative as 0, as PyTorch does.)
{check}
"""
import torch


class ReLU:
    def parameters(self):
        return []

    def forward(self, x):
        """x -> out = max(x, 0), the same shape."""
        # TODO: compute out without changing x in place, and keep what backward needs (where x > 0).
        ### BEGIN SOLUTION
        self.mask = x > 0  # where the gradient may pass
        out = x * self.mask
        ### END SOLUTION
        return out

    def backward(self, dout):
        """dout = dL/dout -> dx = dL/dx, the same shape."""
        # TODO: dx = dout times the local derivative (1 where x > 0, else 0).  Return a new tensor: do not
        #       change dout in place (in a network it may be used elsewhere).
        ### BEGIN SOLUTION
        dx = dout * self.mask
        ### END SOLUTION
        return dx
