"""Exercise adam: write Adam, the optimizer (torch.optim.Adam's update, without weight decay).

step() reads each parameter's .grad g and changes the parameter in place (skip one whose .grad is None).
For each parameter, with t the number of steps taken so far (1 at the first step):
    m = beta1 m + (1 - beta1) g           the moving average of the gradient, m = 0 at the start
    v = beta2 v + (1 - beta2) g^2         the moving average of its square, v = 0 at the start
    m_hat = m / (1 - beta1^t)             bias corrections: m and v start at 0, so early on they are
    v_hat = v / (1 - beta2^t)             too small by these factors
    p = p - lr m_hat / (sqrt(v_hat) + eps)
Shapes: m and v have their parameter's shape.  eps keeps the step finite where v_hat is ~0: it is added
after the square root.
{check}
"""
import torch


class Adam:
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params = list(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        # TODO: the state step() needs: a step count, and m and v for each parameter.
        ### BEGIN SOLUTION
        self.t = 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        ### END SOLUTION

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        """Update every parameter that has a .grad, in place."""
        # TODO: one Adam step for each parameter, as the docstring above writes it.  Change p itself (p -= ...
        #       or p.sub_(...)): p = p - ... would only rebind the name.
        ### BEGIN SOLUTION
        beta1, beta2 = self.betas
        self.t += 1
        for p, m, v in zip(self.params, self.m, self.v):
            if p.grad is None:
                continue
            g = p.grad
            m.mul_(beta1).add_((1 - beta1) * g)  # in place: m and v are this optimizer's state
            v.mul_(beta2).add_((1 - beta2) * g * g)
            m_hat = m / (1 - beta1 ** self.t)
            v_hat = v / (1 - beta2 ** self.t)
            p -= self.lr * m_hat / (v_hat.sqrt() + self.eps)
        ### END SOLUTION
