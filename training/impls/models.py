"""The models a run trains: the hand-written model, and the same weights as an engine model and an nn.Module.

``build_models(model, run, device, dtype)`` draws the hand-written model's weights once (seeded by ``run.seed``)
and copies them into every other implementation the run trains (``run.impls``), so all of them start equal.
"""

from __future__ import annotations

from typing import Any

import torch

from autodiff import EngineNet
from layers import BatchNorm2d, Conv2d, Dropout, Flatten, Linear, MaxPool2d, ReLU, Sequential, convert_sync_batchnorm
from models import Net, PytorchNet, seeded_dropouts

from ..config.model import ModelConfig
from ..config.run import RunConfig
from ..parallel.verify.twin_syncbn import sync_batchnorm_twin

SAMPLE_SHAPES = {"mlp": (784,), "cnn": (1, 28, 28)}  # the shape of one input sample each model takes


def cnn(num_classes: int = 10, *, device=None, dtype=None) -> Sequential:
    """The CNN of ``--model cnn``: 1x28x28 images -> class logits, every layer hand-written.

        conv 3x3 (1 -> 32, pad 1) -> batch norm -> ReLU -> max pool 2        (N, 32, 14, 14)
        conv 3x3 (32 -> 64, pad 1) -> batch norm -> ReLU -> max pool 2       (N, 64, 7, 7)
        flatten -> dropout 0.3 -> linear 3136 -> 128 -> ReLU -> dropout 0.3 -> linear 128 -> C

    The convolutions feeding batch norm have no bias (batch norm's beta is the bias).  Its nn.Module twin is
    ``cnn().to_torch()``: the same torch.nn layers, the same weights.
    """
    kw: dict[str, Any] = {"device": device, "dtype": dtype}
    return Sequential(
        Conv2d(1, 32, 3, padding=1, bias=False, **kw),
        BatchNorm2d(32, **kw),
        ReLU(),
        MaxPool2d(2),
        Conv2d(32, 64, 3, padding=1, bias=False, **kw),
        BatchNorm2d(64, **kw),
        ReLU(),
        MaxPool2d(2),
        Flatten(),
        Dropout(0.3),
        Linear(64 * 7 * 7, 128, **kw),
        ReLU(),
        Dropout(0.3),
        Linear(128, num_classes, **kw),
    )


def build_models(
    model: ModelConfig,
    run: RunConfig,
    device: torch.device,
    dtype: torch.dtype,
    sync_bn: bool = False,
) -> dict[str, object]:
    """impl name -> image model, for every name in ``run.impls``, all with the same initial weights.

    ``sync_bn`` (under torchrun): batch norm becomes the hand-written SyncBatchNorm, and nn.SyncBatchNorm in the
    twin, so batch statistics are those of the global batch.
    """
    torch.manual_seed(run.seed)
    impls = run.impls
    if model.name == "cnn":
        manual = cnn(device=device, dtype=dtype)
        twin = seeded_dropouts(manual.to_torch())  # the twin draws its dropout masks as the hand-written layers do
        if sync_bn:
            manual, twin = convert_sync_batchnorm(manual), sync_batchnorm_twin(twin, torch.device(device))
        return {name: {"manual": manual, "torch": twin}[name] for name in impls}
    size: dict[str, Any] = {"hidden_size": model.hidden, "depth": model.depth, "device": device, "dtype": dtype}
    manual = Net(**size)
    models: dict[str, object] = {}
    if "manual" in impls:
        models["manual"] = manual
    if "engine" in impls:
        engine = EngineNet(**size)
        engine.load_state_dict(manual.state_dict())
        models["engine"] = engine
    if "torch" in impls:
        twin = PytorchNet(**size)
        twin.load_state_dict(manual.state_dict())
        models["torch"] = twin
    return models


def _walk(model):
    """Every module of an nn.Module, or every layer of a hand-written model (containers included)."""
    if isinstance(model, torch.nn.Module):
        yield from model.modules()
        return
    stack = [model]
    while stack:
        node = stack.pop()
        yield node
        if hasattr(node, "named_children"):
            stack.extend(child for _, child in node.named_children())


def use_generator(model, gen: torch.Generator, global_rows: tuple[int, int, int] | None = None) -> None:
    """Point every dropout layer of ``model`` (hand-written, or the twin's seeded nn.Dropout) at ``gen``; under data
    parallelism ``global_rows=(lo, hi, total)`` says which rows of the global batch this process holds."""
    for node in _walk(model):
        if hasattr(node, "generator") and hasattr(node, "p"):
            node.generator = gen
            node.global_rows = global_rows
