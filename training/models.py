"""The models a run trains: the hand-written model, and the same weights as an engine model and an nn.Module.

``build_models(config, device, dtype)`` draws the hand-written model's weights once (seeded) and copies them into
every other implementation the config asks for, so all of them start equal.
"""
from __future__ import annotations

import torch

from autodiff import EngineNet
from layers import Net, PytorchNet

from .config import TrainConfig

SAMPLE_SHAPES = {"mlp": (784,)}  # the shape of one input sample each model takes


def build_models(config: TrainConfig, device: torch.device, dtype: torch.dtype) -> dict[str, object]:
    """impl name -> model, for every name in ``config.impls``, all with the same initial weights."""
    torch.manual_seed(config.seed)
    manual = Net(hidden_size=config.hidden, depth=config.depth, device=device, dtype=dtype)
    models: dict[str, object] = {}
    if "manual" in config.impls:
        models["manual"] = manual
    if "engine" in config.impls:
        engine = EngineNet(hidden_size=config.hidden, depth=config.depth, device=device, dtype=dtype)
        engine.load_state_dict(manual.state_dict())
        models["engine"] = engine
    if "torch" in config.impls:
        twin = PytorchNet(hidden_size=config.hidden, depth=config.depth, device=device, dtype=dtype)
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


def use_generator(model, gen: torch.Generator) -> None:
    """Point every dropout layer of ``model`` (hand-written, or the twin's seeded nn.Dropout) at ``gen``."""
    for node in _walk(model):
        if hasattr(node, "generator") and hasattr(node, "p"):
            node.generator = gen
