"""Hand-written layers: each computes its own backward pass."""
from .activations import ReLU, Sigmoid, Softmax, Tanh
from .convert import from_torch, to_torch
from .layer import BaseLayer, Layer
from .linear import Linear
from .net import Net
from .sequential import Sequential
from .torch_net import PytorchNet

__all__ = ["Layer", "BaseLayer", "Linear", "ReLU", "Tanh", "Sigmoid", "Softmax", "Sequential", "Net", "PytorchNet",
           "from_torch", "to_torch"]
