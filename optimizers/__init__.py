"""Optimizers whose update equations are written by hand; drop-in replacements for torch.optim's."""

from .adagrad import Adagrad
from .adam import Adam, AdamW
from .base import HandOptimizer
from .clip import clip_grad_norm_, clip_grad_value_
from .registry import OPTIMIZERS, get_optimizer
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = [
    "HandOptimizer",
    "SGD",
    "RMSprop",
    "Adam",
    "AdamW",
    "Adagrad",
    "get_optimizer",
    "OPTIMIZERS",
    "clip_grad_norm_",
    "clip_grad_value_",
]
