"""TrainConfig: a training run's settings, in five typed parts, made and checked in one place.

    config = TrainConfig(model="gpt", n_embd=64, max_iters=500)      # every setting by its command-line name
    config.model.n_embd, config.optim.lr, config.run.max_iters, config.parallel.zero, config.data.batch_size

A setting left out takes its declared default (in its part's file: data.py, model.py, ...), which for some depends
on the model (the image runs' and the text runs' differ: nanoGPT's CPU configuration for Shakespeare on the text
side).  ``given`` names the settings the user gave (a resumed run keeps the checkpoint's for the others).  Each part
checks its own values; what spans parts is checked here: a setting of the other model family is refused, never
ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import cast

import torch

from ..errors import UsageError
from .choices import FAMILIES, TEXT_DATASETS, TEXT_MODELS, family_of, flag
from .data import DataConfig
from .model import ModelConfig
from .optim import OptimConfig
from .parallel import ParallelConfig
from .run import RunConfig
from .setting import PerModel, Setting, settings_of

PARTS = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "run": RunConfig, "parallel": ParallelConfig}
# every setting by its key (its command-line name): the part that holds it, and its declaration
SETTINGS: dict[str, tuple[str, Setting]] = {s.key: (part, s) for part, cls in PARTS.items() for s in settings_of(cls)}


def declared(key: str) -> Setting:
    return SETTINGS[key][1]


def keys(**having) -> tuple[str, ...]:
    """The keys of the settings whose declarations have these values: keys(keeps="math"), keys(local=True)."""
    return tuple(k for k, (_, s) in SETTINGS.items() if all(getattr(s, a) == v for a, v in having.items()))


@dataclass(frozen=True, init=False)
class TrainConfig:
    data: DataConfig
    model: ModelConfig
    optim: OptimConfig
    run: RunConfig
    parallel: ParallelConfig
    given: frozenset = field(compare=False)  # the keys of the settings the user gave

    def __init__(self, *, given: Iterable[str] = frozenset(), **settings):
        given = frozenset(given)
        unknown = sorted((set(settings) | given) - set(SETTINGS))
        if unknown:
            raise UsageError(
                f"unknown settings: {', '.join(unknown)} (train.py --help lists every setting as its "
                f"flag: batch_size is --batch-size)"
            )
        family = family_of(settings.get("model"), settings.get("dataset"), settings.get("data_file"))
        model = settings.get("model") or cast(PerModel, declared("model").default).of(None, family)
        values = {}
        for key, (_, s) in SETTINGS.items():
            value = settings.get(key, None if s.varies else s.default)
            values[key] = cast(PerModel, s.default).of(model, family) if value is None and s.varies else value
        values["model"] = model
        parallel = ParallelConfig(**_part_values(ParallelConfig, values))
        if parallel.requested(given) and "impl" not in given and values["impl"] == "both":
            values["impl"] = "manual"  # the split trains the hand-written GPT (its twins are not split)
        object.__setattr__(self, "given", given)
        object.__setattr__(self, "parallel", parallel)
        for name, cls in PARTS.items():
            if name != "parallel":
                object.__setattr__(self, name, cls(**_part_values(cls, values)))
        object.__setattr__(self, "optim", replace(self.optim, matrices_only=self.is_text))
        self._check_across()

    # -- what the parts say together --------------------------------------------------------------------------------

    @property
    def family(self) -> str:
        """ "image" or "text": which data, models, loop and defaults the run uses."""
        return family_of(self.model.name, self.data.dataset, self.data.data_file)

    @property
    def is_text(self) -> bool:
        return self.family == "text"

    @property
    def model_parallel(self) -> bool:
        """Whether the run takes training/parallel/run.py's path."""
        return self.parallel.requested(self.given)

    def settings(self, keys_: Iterable[str] | None = None) -> dict:
        """key -> value of every setting (or of ``keys_``), as TrainConfig(**...) takes them."""
        chosen = SETTINGS if keys_ is None else keys_
        return {k: getattr(getattr(self, SETTINGS[k][0]), SETTINGS[k][1].field) for k in chosen}

    def shared(self) -> dict:
        """flag -> value of every setting the ranks of one run must agree on (all but the local ones)."""
        return {flag(k): v for k, v in self.settings(k for k in SETTINGS if k not in LOCAL_KEYS).items()}

    def default_of(self, key: str):
        """The default of setting ``key`` for this run's model and family."""
        s = declared(key)
        return cast(PerModel, s.default).of(self.model.name, self.family) if s.varies else s.default

    def replace(self, *, given: Iterable[str] | None = None, **changes) -> TrainConfig:
        """A copy with ``changes`` (settings by key); ``given`` replaces the given keys."""
        return TrainConfig(**{**self.settings(), **changes}, given=self.given if given is None else given)

    def _check_across(self) -> None:
        """What no part can check alone: the data fits the model, no setting of another model is set, the rates
        fit the weights' dtype, the engine builds this model, the split fits the model."""
        model, family = self.model.name, self.family
        if family == "text" and self.data.dataset not in TEXT_DATASETS:
            raise UsageError(
                f"--model {model} is a language model: it trains on text (--dataset "
                f"{', '.join(TEXT_DATASETS)}, or --data-file PATH), not --dataset {self.data.dataset}"
            )
        if family == "image" and self.data.dataset in TEXT_DATASETS:
            raise UsageError(
                f"--dataset {self.data.dataset} is text: train it with a language model (--model "
                f"{', '.join(TEXT_MODELS)}), not --model {model}"
            )
        if family == "image" and self.optim.schedule == "warmup-cosine":
            raise UsageError(
                "--schedule warmup-cosine is the text runs' (its --warmup-iters, --min-lr and "
                "--lr-decay-iters count iterations); the image runs take constant, cosine or onecycle"
            )
        values = self.settings()
        for key, (_, s) in SETTINGS.items():  # a setting of another model: refused where given or set, never ignored
            if not s.applies_to(model, family) and (key in self.given or values[key] != self.default_of(key)):
                raise UsageError(_not_for(s, model, family))
        largest = torch.finfo(self.run.torch_dtype).max  # the optimizer computes with these in the weights' dtype
        name, value = self.optim.largest()
        if value > largest:
            weights = str(self.run.torch_dtype).removeprefix("torch.")
            raise UsageError(f"{name} {value} is out of range (at most {largest:.3g}: the weights are {weights})")
        if model != "mlp" and "engine" in self.run.impls:
            raise UsageError(
                f"--impl {self.run.impl}: the autodiff engine builds only the MLP, not --model {model}; "
                f"use --impl manual, torch or both"
            )
        for key in ("top_k", "capacity_factor", "aux_coef"):  # the mixture of experts' settings, without one
            if key in self.given and not self.model.n_experts:
                raise UsageError(f"{flag(key)} applies to a mixture of experts: give --n-experts K > 0")
        if self.model.n_experts and self.run.is_mixed:
            raise UsageError(
                f"--n-experts {self.model.n_experts} with --dtype {self.run.dtype} is not supported (the "
                f"load-balancing loss's gradient is not loss-scaled): use float32 or float64"
            )
        if self.model_parallel:
            self.parallel.check_split(self.model, self.run, self.given)


def _part_values(cls, values: dict) -> dict:
    return {s.field: values[s.key] for s in settings_of(cls)}


def _not_for(s: Setting, model: str, family: str) -> str:
    """Why setting ``s`` cannot be set for ``model``, in one line."""
    applies = cast(tuple, s.applies)  # not None: a setting that applies to every model is never refused
    kinds = {a if a in FAMILIES else family_of(a, None) for a in applies}
    if family not in kinds:  # a setting of the other family
        kind = kinds.pop()
        models = ", ".join(FAMILIES[kind])
        return f"{s.flag} applies to the {kind} models ({models}), not --model {model}" + (
            "; a text run counts --max-iters and evaluates every --eval-interval" if kind == "image" else ""
        )
    names = list(applies)
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return f"{s.flag} applies to --model {listed} only, not --model {model}"


MATH_KEYS = keys(keeps="math")  # a resumed run keeps them: the numbers it produces depend on them
RECORD_KEYS = keys(keeps="record")  # a resumed run keeps them unless they are given again
LOCAL_KEYS = keys(local=True)  # under torchrun the ranks may differ in these (where things are, printing)
__all__ = ["TrainConfig", "SETTINGS", "MATH_KEYS", "RECORD_KEYS", "LOCAL_KEYS", "declared", "keys", "flag"]
