"""Textbook versions of the fast layers, for the reader and the tests only.

The layers in this package are written for speed and for agreement with autograd to
the last bit: Linear keeps nn.Linear's memory layout, ReLU's backward multiplies by
sign(out), cross-entropy orders its operations as autograd rounds them.  Here is the
same math the way a textbook writes it, in CS231n's ``out, cache = f_forward(...)`` /
``dx, dw = f_backward(dout, cache)`` style.  Nothing in the library calls these;
``tests/test_reference.py`` checks that the fast layers compute the same numbers,
so you can learn from this file and trust the fast one.
"""
from __future__ import annotations

import torch
from torch import Tensor


def linear_forward(x: Tensor, w: Tensor, b: Tensor) -> tuple[Tensor, tuple]:
    """x (N, D), w (D, H), b (H,) -> out (N, H) = x @ w + b."""
    out = x @ w + b
    return out, (x, w)


def linear_backward(dout: Tensor, cache: tuple) -> tuple[Tensor, Tensor, Tensor]:
    """dout (N, H) -> dx (N, D) = dout @ w^T, dw (D, H) = x^T @ dout, db (H,) = sum over the batch of dout."""
    x, w = cache
    return dout @ w.T, x.T @ dout, dout.sum(0)


def relu_forward(x: Tensor) -> tuple[Tensor, Tensor]:
    """out = max(x, 0); the cache is the mask of where x > 0."""
    mask = x > 0
    return x * mask, mask


def relu_backward(dout: Tensor, mask: Tensor) -> Tensor:
    """The gradient flows where the input was positive and stops elsewhere."""
    return dout * mask


def softmax_cross_entropy(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """logits (N, C), class indices y (N,) -> (mean loss, dL/dlogits (N, C) = (softmax - onehot(y)) / N)."""
    n = logits.shape[0]
    shifted = logits - logits.max(1, keepdim=True).values  # subtract the row max: exp cannot overflow
    p = shifted.exp() / shifted.exp().sum(1, keepdim=True)  # (N, C) softmax
    loss = -p[torch.arange(n), y].log().mean()
    onehot = torch.zeros_like(p)
    onehot[torch.arange(n), y] = 1
    return loss, (p - onehot) / n
