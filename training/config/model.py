"""The configuration's model part (ModelConfig): which model, and its size; the models' builders take it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UsageError
from .choices import MODELS
from .setting import check_fraction, check_part, per_model, setting


@dataclass(frozen=True)
class ModelConfig:
    """The model: which one, and its size."""

    name: str = setting(
        per_model(image="mlp", text="gpt"),
        "{image}: the default Net (the default with an image dataset); cnn: the CNN; {text}: a character-level GPT "
        "(the default with a text corpus); lstm, gru: character-level recurrent language models",
        key="model",
        choices=MODELS,
        keeps="math",
    )
    hidden: int | None = setting(
        per_model(mlp=1024, recurrent=256),
        "the MLP's hidden width, or the lstm/gru's hidden size (default: {mlp} for the MLP, {recurrent} for lstm/gru)",
        type=int,
        low=1,
        keeps="math",
        applies=("mlp", "lstm", "gru"),
    )
    depth: int = setting(3, "number of MLP hidden layers", type=int, low=0, keeps="math", applies=("mlp",))
    sync_bn: bool = setting(
        True,
        "under torchrun: per-process batch norm statistics (the twin then uses plain "
        "BatchNorm under DDP) instead of synchronised ones",
        type=bool,
        form="negated",
        applies=("image",),
    )
    block_size: int = setting(
        64, "context length: characters per window", type=int, low=1, group="text", keeps="math", applies=("text",)
    )
    n_layer: int | None = setting(
        per_model(gpt=4, recurrent=2),
        "GPT blocks, or stacked recurrent layers (default: {gpt} for gpt, {recurrent} for lstm/gru)",
        type=int,
        low=1,
        group="text",
        keeps="math",
        applies=("text",),
    )
    n_head: int = setting(4, "GPT attention heads", type=int, low=1, group="text", keeps="math", applies=("gpt",))
    n_embd: int = setting(
        128,
        "GPT width, or the recurrent models' embedding width",
        type=int,
        low=1,
        group="text",
        keeps="math",
        applies=("text",),
    )
    dropout: float = setting(0.0, "dropout probability", type=float, group="text", keeps="math", applies=("text",))
    bias: bool = setting(
        False,
        "biases in the GPT's Linears and LayerNorms (default: off, as in nanoGPT's train.py)",
        type=bool,
        form="either",
        group="text",
        keeps="math",
        applies=("gpt",),
    )
    n_experts: int = setting(
        0,
        "each block's MLP a mixture of K experts (C -> 4C -> C each) behind a softmax router; 0: the dense MLP",
        type=int,
        low=0,
        metavar="K",
        group="text",
        keeps="math",
        applies=("gpt",),
    )
    top_k: int = setting(
        2,
        "with --n-experts: the experts each token is sent to",
        type=int,
        low=1,
        group="text",
        keeps="math",
        applies=("gpt",),
    )
    capacity_factor: float = setting(
        1.25,
        "with --n-experts: an expert takes at most ceil(F top_k N / K) of a batch's N tokens, the rest dropped "
        "(passed on by the residual)",
        type=float,
        metavar="F",
        group="text",
        keeps="math",
        applies=("gpt",),
    )
    aux_coef: float = setting(
        0.01,
        "with --n-experts: the weight of the load-balancing loss K sum_e f_e P_e (Switch's, Mixtral's) added to "
        "the loss",
        type=float,
        group="text",
        keeps="math",
        applies=("gpt",),
    )

    def __post_init__(self):
        check_part(self)
        check_fraction("dropout", self.dropout)
        if self.name == "gpt" and self.n_embd % self.n_head:
            raise UsageError(f"--n-embd {self.n_embd} is not divisible by --n-head {self.n_head}")
        if self.n_experts and self.top_k > self.n_experts:
            raise UsageError(f"--top-k {self.top_k} is more than --n-experts {self.n_experts}")
        if self.n_experts and not (self.capacity_factor > 0 and math.isfinite(self.capacity_factor)):
            raise UsageError(f"--capacity-factor {self.capacity_factor} is out of range (a positive number)")
        if self.n_experts and not (self.aux_coef >= 0 and math.isfinite(self.aux_coef)):
            raise UsageError(f"--aux-coef {self.aux_coef} is out of range (a number >= 0)")
