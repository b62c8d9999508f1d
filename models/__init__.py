"""Whole models built from the layers, each beside its nn.Module twin: the MLP ``Net``, nanoGPT's ``GPT``, the
recurrent language model, the key/value cache and the sampling that serve them."""

from .gpt import GPT
from .net import Net
from .recurrent_lm import RecurrentLM, TorchRecurrentLM
from .sampling import generate_recurrent, next_token
from .seeded_recurrent import SeededGRU, SeededLSTM, SeededRNN, seeded_dropouts
from .torch_gpt import PytorchGPT
from .torch_net import PytorchNet

__all__ = [
    "Net",
    "PytorchNet",
    "GPT",
    "PytorchGPT",
    "RecurrentLM",
    "TorchRecurrentLM",
    "SeededRNN",
    "SeededLSTM",
    "SeededGRU",
    "seeded_dropouts",
    "next_token",
    "generate_recurrent",
]
