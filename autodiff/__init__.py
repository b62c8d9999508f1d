"""A small reverse-mode autograd engine on torch tensors, the default Net built on it, and its graph drawn."""

from .draw import draw_graph
from .engine import Tensor, is_grad_enabled, no_grad
from .functional import cross_entropy
from .nn import MLP, EngineNet, Linear, Module, ReLU, Sequential, Tanh

__all__ = [
    "Tensor",
    "no_grad",
    "is_grad_enabled",
    "cross_entropy",
    "Module",
    "Linear",
    "ReLU",
    "Tanh",
    "Sequential",
    "MLP",
    "EngineNet",
    "draw_graph",
]
