"""What a checkpoint holds of the implementations (``impls_state``), and loading it into a freshly built run
(``restore``): weights and buffers, optimizer states (an older format's Linear state transposed to today's layout),
schedulers, loss scalers and random streams, each checked against the model before it is loaded; a missing or
mis-shaped tensor, or more steps than the checkpoint's epochs hold, is refused naming it."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from ..storage.checkpoint import TRANSPOSED_LINEAR_STATE, _refuse
from . import load_weights_state, weights_state


def impls_state(impls: dict) -> dict:
    """Every implementation's weights (a mixed-precision run's float32 masters), optimizer, scheduler and loss
    scaler state, by implementation, as a checkpoint keeps them."""
    return {
        "models": {name: weights_state(impl) for name, impl in impls.items()},
        "optimizers": {name: impl.opt.state_dict() for name, impl in impls.items()},
        "schedulers": {name: impl.sched.state_dict() for name, impl in impls.items() if impl.sched is not None},
        "scalers": {
            name: impl.scaler.state_dict() for name, impl in impls.items() if getattr(impl, "scaler", None) is not None
        },
    }


def set_capturable(opt: torch.optim.Optimizer, capturable: bool, tensor_lr: bool = False) -> None:
    """Make a loaded optimizer state fit this run: ``capturable`` in every group (load_state_dict brings back the
    saved run's flag), the learning rate a tensor beside the parameters (``tensor_lr``: a captured step with a
    schedule, as impls.capturable_kwargs sets it) or a number, and each step counter where that mode keeps it
    (the parameter's device, or the CPU)."""
    for group in opt.param_groups:
        if "capturable" in group:
            group["capturable"] = capturable
            lr, p0 = group["lr"], group["params"][0]
            if tensor_lr:
                group["lr"] = torch.as_tensor(lr).to(dtype=p0.dtype, device=p0.device)
            elif isinstance(lr, torch.Tensor):
                group["lr"] = lr.item()
            for p in group["params"]:
                state = opt.state.get(p, {})
                if isinstance(state.get("step"), torch.Tensor):
                    state["step"] = state["step"].to(p.device if capturable else "cpu")


def restore(
    impls: dict,
    ckpt: dict,
    batch_gen: torch.Generator,
    device: torch.device,
    steps_per_epoch: int,
    path: Path,
    say: Callable = print,
) -> None:
    """Load weights, buffers, optimizer states and random streams from ``ckpt`` into a freshly built run, checking
    each against the model first: a missing or mis-shaped tensor, or more steps than the checkpoint's epochs
    hold, is refused naming it."""
    most = ckpt["epoch"] * steps_per_epoch
    for name, impl in impls.items():
        _check_weights(name, weights_state(impl), ckpt["models"][name], path)
        load_weights_state(impl, {k: v.to(device) for k, v in ckpt["models"][name].items()})
        opt_state = ckpt["optimizers"][name]
        if name in TRANSPOSED_LINEAR_STATE.get(ckpt["format"], ()):
            opt_state, count = _untranspose_linear_state(impl, opt_state)
            if count:
                say(
                    f"note: {path} was written before handgrad kept Linear weights as (out, in); the optimizer "
                    f"state of {count} Linear weight(s) of '{name}' was transposed to match"
                )
        _load(path, f"optimizers.{name}", impl.opt.load_state_dict, opt_state)
        _check_optimizer(name, impl.opt, most, path)
        if name == "manual":  # a checkpoint of an eager run continued with --cuda-graph, or the reverse
            set_capturable(impl.opt, impl.cuda_graph, tensor_lr=impl.cuda_graph and impl.sched is not None)
        if impl.sched is not None:
            _load(path, f"schedulers.{name}", impl.sched.load_state_dict, ckpt["schedulers"][name])
            if not 0 <= impl.sched.last_epoch <= most:
                _refuse(
                    path,
                    f"'schedulers.{name}' is at step {impl.sched.last_epoch}, outside the 0..{most} steps "
                    f"of its {ckpt['epoch']} epochs",
                )
        if getattr(impl, "scaler", None) is not None:
            _load(path, f"scalers.{name}", impl.scaler.load_state_dict, ckpt["scalers"][name])
    _load(path, "rng.torch", torch.set_rng_state, ckpt["rng"]["torch"])
    _load(path, "rng.batches", batch_gen.set_state, ckpt["rng"]["batches"])
    if ckpt["rng"].get("cuda") and torch.cuda.is_available():
        _load(path, "rng.cuda", torch.cuda.set_rng_state_all, ckpt["rng"]["cuda"])


def _untranspose_linear_state(impl, opt_state: dict) -> tuple[dict, int]:
    """An optimizer state of format 1-3, whose tensors for a Linear weight (hand-written or the engine's) were kept
    as (in, out), in today's (out, in) layout, and how many parameters that changed.  State maps by position: the
    i-th tensor of the optimizer's groups is the i-th parameter."""
    model_params = [p for _, p in impl.named_parameters()]
    master = getattr(impl, "master", None)  # a mixed-precision run's optimizer steps the masters, in the same order
    optimized = [p for group in impl.opt.param_groups for p in group["params"]]
    to_model = dict(zip(map(id, master.parameters()), model_params, strict=True)) if master is not None else {}
    linear = _linear_weights(impl.model)
    state, count = dict(opt_state.get("state", {})), 0
    for i, p in enumerate(optimized):
        if id(to_model.get(id(p), p)) not in linear or i not in state:
            continue
        entry = dict(state[i])
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape == p.shape[::-1]:
                entry[key] = value.t().contiguous()
        state[i], count = entry, count + 1
    return {**opt_state, "state": state}, count


def _linear_weights(model) -> set[int]:
    """ids of every Linear weight in a model: a hand-written layer tree's ``layers.Linear`` or the engine's
    ``autodiff.nn.Linear`` (walked through children, attributes and lists, with an explicit stack)."""
    from autodiff import nn as engine_nn
    from layers import Linear
    from layers.layer import BaseLayer

    found, stack, seen = set(), [model], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Linear):
            found.add(id(node.weight))
        elif isinstance(node, engine_nn.Linear):
            found.add(id(node.weight.data))  # the torch tensor the engine's optimizer holds
        if isinstance(node, BaseLayer):
            stack.extend(child for _, child in node.named_children())
        elif isinstance(node, engine_nn.Module):
            for value in vars(node).values():
                stack.extend(value if isinstance(value, list) else [value])
    return found


def _load(path: Path, field: str, load, state) -> None:
    """``load(state)``; its errors (a missing key, a wrong type, an optimizer refusing a state) become one line naming
    the field: the error's first line, whole (handgrad's own say what and how; torch's pages of explanation are cut
    at their first line)."""
    try:
        load(state)
    except (KeyError, ValueError, TypeError, RuntimeError, IndexError, AttributeError) as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        _refuse(path, f"'{field}' does not fit this run ({type(e).__name__}: {text})")


def _check_weights(name: str, model: dict, saved: dict, path: Path) -> None:
    for key, t in model.items():
        if key not in saved:
            _refuse(path, f"'models.{name}' has no '{key}'")
        if saved[key].shape != t.shape:
            _refuse(path, f"'models.{name}.{key}' has shape {tuple(saved[key].shape)}, the model's is {tuple(t.shape)}")
    for key in saved.keys() - model.keys():
        _refuse(path, f"'models.{name}.{key}' is not in the model (its keys: {', '.join(list(model)[:4])}, ...)")


def _check_optimizer(name: str, opt: torch.optim.Optimizer, most: int, path: Path) -> None:
    """Each state tensor has its parameter's shape (torch's load_state_dict does not check; a mis-shaped one
    would broadcast), and no parameter has taken more steps than the checkpoint's epochs hold."""
    params = [p for group in opt.param_groups for p in group["params"]]
    for i, p in enumerate(params):
        for key, value in opt.state.get(p, {}).items():
            if key == "step":
                steps = float(value)
                if not (math.isfinite(steps) and 0 <= steps <= most):
                    _refuse(
                        path,
                        f"'optimizers.{name}' parameter {i} has taken {steps:g} steps, outside the 0..{most}"
                        f" steps of the checkpoint's epochs",
                    )
            elif isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != p.shape:
                _refuse(
                    path,
                    f"'optimizers.{name}' {key} of parameter {i} has shape {tuple(value.shape)}, the "
                    f"parameter's is {tuple(p.shape)}",
                )
