"""The configuration's optimizer part (OptimConfig): the optimizer, its hyper-parameters and the learning
rate's schedule; the optimizer's set-up takes it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from layers.checks import is_a
from optimizers import OPTIMIZERS

from ..errors import UsageError
from .choices import SCHEDULES, flag
from .setting import check_fraction, check_part, per_model, setting


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer, its hyper-parameters and the learning rate's schedule."""

    lr: float = setting(1e-3, "learning rate (the peak, with --schedule onecycle)", type=float, keeps="math")
    optimizer: str = setting(
        per_model(image="adam", text="adamw"),
        "one of " + ", ".join(OPTIMIZERS) + " (default: {image} for images, {text} for text)",
        choices=tuple(OPTIMIZERS),
        listed=False,
        keeps="math",
    )
    momentum: float = setting(0.0, "for sgd and rmsprop", type=float, keeps="math")
    weight_decay: float = setting(
        per_model(image=0.0, text=0.1),
        "the optimizer's weight_decay, adamw's "
        "decoupled; text runs decay the matrices and embeddings only, as nanoGPT "
        "(default: {image:g} for images, {text} for text)",
        type=float,
        keeps="math",
    )
    beta2: float = setting(
        per_model(image=0.999, text=0.99),
        "adam/adamw's second-moment decay (default: {image} for images, {text} for text)",
        type=float,
        keeps="math",
    )
    schedule: str = setting(
        per_model(image="constant", text="warmup-cosine"),
        "learning rate per step: {image} (the images' default); cosine (annealed to 0); onecycle (warm-up to --lr, "
        "then annealed); {text} (text's default, nanoGPT's: linear warm-up for --warmup-iters, then cosine to "
        "--min-lr at --lr-decay-iters); or, with --pipeline-parallel, the pipeline's schedule: gpipe, 1f1b (its "
        "default), zb-h1 (zero bubble: weight gradients fill the bubbles), interleaved-1f1b (--virtual-stages V "
        "stages a rank) or zb-v (two stages a rank in a V, zero bubble); give it twice for both",
        choices=SCHEDULES,
        keeps="math",
    )
    clip_grad: float | None = setting(
        per_model(text=1.0),
        "clip the total gradient norm to MAX_NORM (default: no clipping for images, {text} for text)",
        type=float,
        metavar="MAX_NORM",
        keeps="math",
    )
    min_lr: float = setting(
        1e-4, "warmup-cosine: the learning rate it decays to", type=float, group="text", keeps="math", applies=("text",)
    )
    warmup_iters: int = setting(
        100,
        "warmup-cosine: iterations of linear warm-up",
        type=int,
        low=0,
        group="text",
        keeps="math",
        applies=("text",),
    )
    lr_decay_iters: int = setting(
        2000,
        "warmup-cosine: the iteration at which the rate reaches --min-lr",
        type=int,
        low=1,
        group="text",
        keeps="math",
        applies=("text",),
    )
    # not a flag: the language models decay their matrices and embeddings only, as nanoGPT (set by TrainConfig)
    matrices_only: bool = False

    def __post_init__(self):
        if isinstance(self.optimizer, str):
            object.__setattr__(self, "optimizer", self.optimizer.lower())
        check_part(self)
        for name in ("lr", "momentum", "weight_decay", "clip_grad", "min_lr"):
            value = getattr(self, name)
            if value is None:
                continue
            if not (is_a(value, (int, float)) and math.isfinite(value) and value >= 0) or (
                name == "clip_grad" and value == 0
            ):
                need = "a positive number" if name == "clip_grad" else "a finite number >= 0"
                raise UsageError(f"{flag(name)} {value} is out of range (need {need})")
        check_fraction("beta2", self.beta2)
        if self.momentum and self.optimizer not in ("sgd", "rmsprop"):
            raise UsageError(f"--momentum applies to sgd and rmsprop, not {self.optimizer}")

    def largest(self) -> tuple[str, float]:
        """(flag, value) of the largest of the rates and bounds the optimizer computes with."""
        values = {flag(n): getattr(self, n) for n in ("lr", "momentum", "weight_decay", "clip_grad", "min_lr")}
        return max(((k, v) for k, v in values.items() if v is not None), key=lambda kv: kv[1])
