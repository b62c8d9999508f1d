"""Hand-written layers, the building blocks: each computes its own backward pass (whole models are in ``models``)."""

from .activations import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .attention import (
    MultiheadAttention,
    ScaledDotProductAttention,
    TransformerEncoder,
    TransformerEncoderLayer,
    attention_dropout_mask,
)
from .batchnorm import BatchNorm1d, BatchNorm2d
from .conv import Conv2d
from .dropout import Dropout, SeededDropout
from .embedding import Embedding
from .flatten import Flatten
from .layer import BaseLayer, Layer
from .layernorm import LayerNorm
from .linear import Linear
from .moe import MixtureOfExperts
from .pool import AvgPool2d, MaxPool2d
from .recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from .sequential import Sequential
from .sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm
from .torch_bridge import HandgradModule, as_module, from_torch, to_torch

__all__ = [
    "Layer",
    "BaseLayer",
    "Linear",
    "MixtureOfExperts",
    "ReLU",
    "Tanh",
    "Sigmoid",
    "Softmax",
    "LogSoftmax",
    "LeakyReLU",
    "GELU",
    "SiLU",
    "BatchNorm1d",
    "BatchNorm2d",
    "SyncBatchNorm",
    "convert_sync_batchnorm",
    "LayerNorm",
    "Dropout",
    "SeededDropout",
    "Embedding",
    "ScaledDotProductAttention",
    "MultiheadAttention",
    "TransformerEncoderLayer",
    "TransformerEncoder",
    "attention_dropout_mask",
    "Conv2d",
    "MaxPool2d",
    "AvgPool2d",
    "Flatten",
    "RNN",
    "LSTM",
    "GRU",
    "RNNCell",
    "LSTMCell",
    "GRUCell",
    "Sequential",
    "from_torch",
    "to_torch",
    "as_module",
    "HandgradModule",
]
