"""Exercise gelu: write GELU, out = x Phi(x) (nn.GELU's), or its tanh approximation (GPT-2's).

Shapes: x (any shape) -> out (the same shape); backward: dout (that shape) -> dx (that shape).

Phi is the standard normal CDF, Phi(x) = (1 + erf(x / sqrt(2))) / 2, and phi its density,
phi(x) = exp(-x^2 / 2) / sqrt(2 pi).  out is a product of x and Phi(x): its derivative has two terms.
approximate="tanh": out = x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3): a chain through u.
{check}
"""
import math

import torch


class GELU:
    def __init__(self, approximate="none"):
        self.approximate = approximate  # "none" (the exact GELU, nn.GELU's default) or "tanh"

    def parameters(self):
        return []

    def forward(self, x):
        """x -> out, the same shape."""
        # TODO: out = x Phi(x) (torch.erf is fine), or, with approximate == "tanh", x/2 (1 + tanh(u)); keep what
        #       backward needs.
        ### BEGIN SOLUTION
        self.x = x
        if self.approximate == "tanh":
            self.t = torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))  # tanh(u)
            out = 0.5 * x * (1 + self.t)
        else:
            out = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))  # x Phi(x)
        ### END SOLUTION
        return out

    def backward(self, dout):
        """dout = dL/dout -> dx = dL/dx, the same shape."""
        # TODO: dx = dout times d out / dx: the product rule (Phi(x) + x phi(x)), or, for "tanh", the product
        #       rule and the chain through u (du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)).
        ### BEGIN SOLUTION
        x = self.x
        if self.approximate == "tanh":
            du = math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * x ** 2)
            dx = dout * (0.5 * (1 + self.t) + 0.5 * x * (1 - self.t ** 2) * du)
        else:
            cdf = 0.5 * (1 + torch.erf(x / math.sqrt(2)))  # Phi(x)
            pdf = torch.exp(-0.5 * x ** 2) / math.sqrt(2 * math.pi)  # phi(x)
            dx = dout * (cdf + x * pdf)
        ### END SOLUTION
        return dx
