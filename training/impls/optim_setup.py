"""What every implementation's step shares: its optimizer's arguments and parameter groups, clipping with the
monitor told, and cross-entropy over rows (an image's logits (N, C), or a language model's (B, T, V) flattened)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..config.optim import OptimConfig


def optimizer_kwargs(optim: OptimConfig) -> dict:
    kw: dict[str, Any] = {"lr": optim.lr, "weight_decay": optim.weight_decay}
    if optim.optimizer in ("sgd", "rmsprop"):
        kw["momentum"] = optim.momentum
    if optim.optimizer in ("adam", "adamw"):
        kw["betas"] = (0.9, optim.beta2)
    return kw


def param_groups(named: list[tuple[str, Tensor]], optim: OptimConfig) -> list:
    """The optimizer's parameters: all in one group for the image models; for the language models
    (``optim.matrices_only``) nanoGPT's two (``configure_optimizers``): weight decay on the tensors of two or more
    dimensions (matrices, embeddings), none on biases and layer-norm gains."""
    params = [p for _, p in named]
    if not optim.matrices_only:
        return params
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def capturable_kwargs(optim: OptimConfig, param: torch.Tensor) -> dict:
    """The captured step's optimizer: capturable (step counters on the device) and, with a --schedule, lr a 0-d
    tensor beside the parameters that the kernels read there, so that the schedule's changes (schedulers fill a
    tensor lr in place) reach a replayed graph.  A constant lr stays a number (one kernel fewer in SGD's step)."""
    kw: dict[str, Any] = {"capturable": True}
    if optim.schedule != "constant":
        kw["lr"] = torch.tensor(optim.lr, dtype=param.dtype, device=param.device)
    return kw


def clip_monitored(impl, step: int, clip_fn, params=None) -> Tensor | None:
    """Clip the gradients of ``params`` (default: the model's) with ``clip_fn(params, max_norm)`` if the run clips
    (-> the total norm before), and tell the monitor, if any, about them before and after."""
    mon = impl.monitor
    if mon is not None:
        mon.update(step)
    norm = clip_fn(impl.model.parameters() if params is None else params, impl.clip) if impl.clip else None
    if mon is not None:
        mon.update_after_clip()
    return norm


def rows(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """(N, C) logits and (N,) targets as they are; a language model's (B, T, V) and (B, T) as B*T rows."""
    if logits.dim() == 2:
        return logits, y
    return logits.reshape(-1, logits.shape[-1]), y.reshape(-1)


def aux_loss(model) -> Tensor | None:
    """After a forward: the auxiliary loss a model adds to its loss (a mixture of experts' load-balancing term,
    already weighted), or None."""
    term = getattr(model, "aux_loss", None)
    return term() if callable(term) else None
