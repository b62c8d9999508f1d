"""Exercise rmsprop: write RMSprop, the optimizer (torch.optim.RMSprop's update, without momentum or centering).

step() reads each parameter's .grad g and changes the parameter in place (skip one whose .grad is None).
For each parameter:
    v = alpha v + (1 - alpha) g^2         the moving average of the gradient's square, v = 0 at the start
    p = p - lr g / (sqrt(v) + eps)        each entry's step divided by that entry's typical size
Shapes: v has its parameter's shape.  eps keeps the step finite where v is ~0: it is added after the square
root.  No bias correction (Adam adds one; RMSprop, as torch writes it, does not).
{check}
"""
import torch


class RMSprop:
    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8):
        self.params = list(params)
        self.lr, self.alpha, self.eps = lr, alpha, eps
        # TODO: the state step() needs: v for each parameter.
        ### BEGIN SOLUTION
        self.v = [torch.zeros_like(p) for p in self.params]
        ### END SOLUTION

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        """Update every parameter that has a .grad, in place."""
        # TODO: one RMSprop step for each parameter, as the docstring above writes it.  Change p itself (p -= ...).
        ### BEGIN SOLUTION
        for p, v in zip(self.params, self.v):
            if p.grad is None:
                continue
            g = p.grad
            v.mul_(self.alpha).add_((1 - self.alpha) * g * g)  # in place: v is this optimizer's state
            p -= self.lr * g / (v.sqrt() + self.eps)
        ### END SOLUTION
