"""A small reverse-mode autograd engine on torch tensors, and the default Net built on it."""
from .engine import Tensor, is_grad_enabled, no_grad
from .functional import cross_entropy
from .nn import MLP, EngineNet, Linear, Module, ReLU, Sequential, Tanh

__all__ = ["Tensor", "no_grad", "is_grad_enabled", "cross_entropy", "Module", "Linear", "ReLU", "Tanh",
           "Sequential", "MLP", "EngineNet"]
