"""Exercise sgd_momentum: write SGD with momentum, classical and Nesterov's (torch.optim.SGD's update).

step() reads each parameter's .grad g and changes the parameter in place (skip one whose .grad is None).
With momentum mu > 0, each parameter keeps a buffer, made at its first step and kept between steps:
    buf = g                                at the first step (a copy, not the .grad tensor itself)
    buf = mu buf + g                       at every later one
    d = buf, or with nesterov=True: d = g + mu buf      (Nesterov's looks one step ahead)
    p = p - lr d
With mu = 0: p = p - lr g, plain SGD.  Shapes: buf has its parameter's shape.
{check}
"""
import torch


class SGD:
    def __init__(self, params, lr=1e-2, momentum=0.0, nesterov=False):
        self.params = list(params)
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        # TODO: the state step() needs: one momentum buffer per parameter, none yet.
        ### BEGIN SOLUTION
        self.buf = [None for _ in self.params]
        ### END SOLUTION

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        """Update every parameter that has a .grad, in place."""
        # TODO: one step for each parameter, as the docstring above writes it.  Change p itself (p -= ...).
        ### BEGIN SOLUTION
        for k, p in enumerate(self.params):
            if p.grad is None:
                continue
            d = p.grad
            if self.momentum:
                if self.buf[k] is None:
                    self.buf[k] = d.clone()  # its own tensor: the .grad may be changed or reused
                else:
                    self.buf[k].mul_(self.momentum).add_(d)
                d = d + self.momentum * self.buf[k] if self.nesterov else self.buf[k]
            p -= self.lr * d
        ### END SOLUTION
