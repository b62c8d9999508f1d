"""Hand-written layers: each computes its own backward pass."""
from .activations import ReLU, Sigmoid, Softmax, Tanh
from .layer import Layer
from .linear import Linear
from .net import Net
from .torch_net import PytorchNet

__all__ = ["Layer", "Linear", "ReLU", "Tanh", "Sigmoid", "Softmax", "Net", "PytorchNet"]
