"""``learn train`` for the exercises that are no layer of an image network: which race each one runs."""

from __future__ import annotations

from .train_accumulate import accumulate_race
from .train_blocks import moe_race, ring_race
from .train_broadcast import broadcast_race
from .train_optim import adam_race
from .train_parallel import parallel_race, split_race
from .train_text import text_race
from .train_value import value_race

RACES = {
    "embedding": text_race,
    "lstm_cell": text_race,
    "gru_cell": text_race,
    "attention": text_race,
    "adam": adam_race,
    "rmsprop": adam_race,
    "sgd_momentum": adam_race,
    "value": value_race,
    "broadcast": broadcast_race,
    "accumulate": accumulate_race,
    "linear_split": split_race,
    "tensor_parallel": parallel_race,
    "ring_attention": ring_race,
    "moe_dispatch": moe_race,
}
