"""Exercise mse: write MSELoss, the mean squared error loss = mean((input - target)^2) (nn.MSELoss's).

Shapes: input and target of one shape (any, say (N, C)) -> loss, a 0-d tensor (a scalar); the mean is
over every element, N * C of them.  backward() takes no argument -- the loss is where the backward pass
starts, dL/dloss = 1 -- and returns dL/dinput, the shape of input.
{check}
"""
import torch


class MSELoss:
    def forward(self, input, target):
        """input (N, C), target (N, C) -> loss, a 0-d tensor."""
        # TODO: compute the loss, and keep what backward needs.
        ### BEGIN SOLUTION
        self.diff = input - target  # (N, C)
        loss = (self.diff ** 2).mean()
        ### END SOLUTION
        return loss

    def backward(self):
        """-> dinput = dL/dinput, the shape of input."""
        # TODO: differentiate mean((input - target)^2) with respect to each input element: count the
        #       elements the mean divides by, and do not forget the 2 of the square.
        ### BEGIN SOLUTION
        dinput = 2 * self.diff / self.diff.numel()  # (N, C)
        ### END SOLUTION
        return dinput
