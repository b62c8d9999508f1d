"""The three implementations a run trains side by side, behind one small protocol (``Impl``).

manual: the hand-written model, its explicit backward and a handgrad optimizer; no autograd graph.
engine: the same MLP on handgrad's autodiff engine (gradients from per-operation closures), handgrad optimizer.
torch:  the nn.Module twin: autograd's backward and torch.optim's optimizer.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from autodiff import cross_entropy, no_grad
from losses import CrossEntropyLoss
from optimizers import OPTIMIZERS, clip_grad_norm_, get_optimizer

from .config import TrainConfig
from .models import build_models


class Impl(Protocol):
    name: str
    model: object               # has state_dict() / load_state_dict()
    opt: torch.optim.Optimizer

    def train_step(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """One optimizer step -> (loss, logits, total grad norm before clipping or None); device tensors."""

    def eval_batch(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """-> (summed loss, logits), no gradients."""

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        """(torch-style name, tensor whose .grad is the gradient)."""


def optimizer_kwargs(config: TrainConfig) -> dict:
    kw = {"lr": config.lr, "weight_decay": config.weight_decay}
    if config.optimizer in ("sgd", "rmsprop"):
        kw["momentum"] = config.momentum
    return kw


class ManualImpl:
    name = "manual"

    def __init__(self, model, config: TrainConfig):
        self.model = model
        self.opt = get_optimizer(config.optimizer, model.parameters(), **optimizer_kwargs(config))
        self.crit = CrossEntropyLoss()
        self.eval_crit = CrossEntropyLoss(reduction="sum")
        self.clip = config.clip_grad

    def train_step(self, x, y):
        self.opt.zero_grad()
        logits = self.model(x)
        loss = self.crit(logits, y)
        self.model.backward(self.crit.backward())  # containers skip the first layer's input gradient by default
        norm = clip_grad_norm_(self.model.parameters(), self.clip) if self.clip else None
        self.opt.step()
        return loss, logits, norm

    def eval_batch(self, x, y):
        logits = self.model(x)
        return self.eval_crit(logits, y), logits

    def named_parameters(self):
        return list(self.model.named_parameters())


class EngineImpl:
    name = "engine"

    def __init__(self, model, config: TrainConfig):
        self.model = model
        self.opt = get_optimizer(config.optimizer, model.parameters(), **optimizer_kwargs(config))
        self.clip = config.clip_grad

    def train_step(self, x, y):
        self.opt.zero_grad()
        logits = self.model(x)
        loss = cross_entropy(logits, y)
        loss.backward()
        norm = clip_grad_norm_(self.model.parameters(), self.clip) if self.clip else None
        self.opt.step()
        return loss.data, logits.data, norm

    @no_grad()
    def eval_batch(self, x, y):
        logits = self.model(x)
        return cross_entropy(logits, y, reduction="sum").data, logits.data

    def named_parameters(self):
        return [(name, p.data) for name, p in self.model.named_parameters()]


class TorchImpl:
    name = "torch"

    def __init__(self, model: torch.nn.Module, config: TrainConfig):
        self.model = model
        cls = getattr(torch.optim, OPTIMIZERS[config.optimizer].__name__)  # handgrad's twin in torch.optim
        self.opt = cls(model.parameters(), **optimizer_kwargs(config))
        self.clip = config.clip_grad

    def train_step(self, x, y):
        self.opt.zero_grad()
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip) if self.clip else None
        self.opt.step()
        return loss.detach(), logits.detach(), norm

    @torch.no_grad()
    def eval_batch(self, x, y):
        logits = self.model(x)
        return F.cross_entropy(logits, y, reduction="sum"), logits

    def named_parameters(self):
        return list(self.model.named_parameters())


IMPL_CLASSES = {"manual": ManualImpl, "engine": EngineImpl, "torch": TorchImpl}


def build_impls(config: TrainConfig, device: torch.device, dtype: torch.dtype) -> dict[str, Impl]:
    """impl name -> Impl for every implementation the config names, all from the same initial weights."""
    return {name: IMPL_CLASSES[name](model, config) for name, model in build_models(config, device, dtype).items()}


def set_mode(impls: dict[str, Impl], training: bool) -> None:
    """Training or evaluation mode (dropout, batch norm) for every implementation's model."""
    for impl in impls.values():
        if hasattr(impl.model, "train"):
            impl.model.train(training)


def max_param_abs_diff(impls: dict[str, Impl]) -> float | None:
    """Largest |a - b| over every weight and buffer, between each implementation and the first."""
    if len(impls) < 2:
        return None
    first, *rest = impls.values()
    ref = first.model.state_dict()
    diffs = [(ref[k].double() - v.double()).abs().max() for other in rest
             for k, v in other.model.state_dict().items() if v.is_floating_point() and v.numel()]
    return torch.stack(diffs).max().item()
