"""Look optimizers up by name."""

from __future__ import annotations

from torch.optim import Optimizer

from .adagrad import Adagrad
from .adam import Adam, AdamW
from .rmsprop import RMSprop
from .sgd import SGD

OPTIMIZERS: dict[str, type[Optimizer]] = {
    "sgd": SGD,
    "rmsprop": RMSprop,
    "adam": Adam,
    "adamw": AdamW,
    "adagrad": Adagrad,
}


def get_optimizer(name: str, params, **kwargs) -> Optimizer:
    """``get_optimizer("adam", net.parameters(), lr=1e-3)``; the name is case-insensitive."""
    cls = OPTIMIZERS.get(str(name).lower())
    if cls is None:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
    return cls(params, **kwargs)
