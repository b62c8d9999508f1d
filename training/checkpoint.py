"""Checkpoints: everything a run needs to continue exactly (weights, buffers, optimizer state, random
streams, the log so far), written atomically after every epoch, and read back with the settings it fixes.

A mixed-precision run (--dtype bfloat16/float16) stores float32 weights for every implementation (the manual
run's master weights, not their half rounding) and, for float16, each loss scaler's state (scale and growth
tracker, torch.amp.GradScaler's keys for both).
"""
from __future__ import annotations

from pathlib import Path

import torch

from .config import MATH_FIELDS, RECORD_FIELDS, TrainConfig, flag
from .errors import UsageError
from .files import atomic_write
from .impls import load_weights_state, weights_state

FORMAT = "handgrad-train-2"
READABLE_FORMATS = ("handgrad-train-1", FORMAT)  # version 1 stored the settings under "args", had no --model


def save_checkpoint(path: Path, state: dict) -> None:
    """Atomically: a crash or Ctrl-C during the write leaves the previous checkpoint whole."""
    atomic_write(path, lambda f: torch.save(state, f))


def checkpoint_state(impls: dict, config: TrainConfig, epoch: int, records: list, batch_gen: torch.Generator,
                     ) -> dict:
    return {
        "format": FORMAT, "epoch": epoch,
        "config": {**{k: getattr(config, k) for k in MATH_FIELDS + RECORD_FIELDS}, "epochs": config.epochs},
        "models": {name: weights_state(impl) for name, impl in impls.items()},
        "optimizers": {name: impl.opt.state_dict() for name, impl in impls.items()},
        "schedulers": {name: impl.sched.state_dict() for name, impl in impls.items() if impl.sched is not None},
        "scalers": {name: impl.scaler.state_dict() for name, impl in impls.items()
                    if getattr(impl, "scaler", None) is not None},
        "rng": {"torch": torch.get_rng_state(), "batches": batch_gen.get_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "records": records,  # every metrics.jsonl line so far
    }


def load_checkpoint(path: Path, config: TrainConfig) -> tuple[TrainConfig, dict]:
    """Read a checkpoint; return the config it continues (its settings adopted) and the checkpoint.

    A setting given explicitly that differs from the checkpoint's is an error naming both values (for the
    settings of what is recorded, --log-interval, --val-interval, --monitor, the given value applies).  Without
    --epochs the run's own target is kept; a checkpoint that already holds every requested epoch is returned as
    is (the run then only completes its outputs).
    """
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"--resume {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"--resume {path} is a folder; pass the checkpoint.pt inside it") from None
    except PermissionError as e:
        raise UsageError(f"--resume {path}: cannot read it ({e.strerror})") from None
    except Exception as e:  # torch's weights_only explanation is pages long: one line is enough
        first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
        raise UsageError(f"--resume {path} is not a handgrad checkpoint ({type(e).__name__}: {first})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") not in READABLE_FORMATS:
        raise UsageError(f"--resume {path} is not a handgrad train.py checkpoint")
    saved = dict(ckpt.get("config") or ckpt["args"])
    saved.setdefault("model", "mlp")
    changes = {}
    for key in MATH_FIELDS:
        if key not in saved:
            continue
        value = getattr(config, key)
        if key in config.given and value != saved[key]:
            raise UsageError(f"--resume: the checkpoint was trained with {flag(key)} {saved[key]}, but {flag(key)} "
                             f"{value} was given; drop {flag(key)} to continue it")
        changes[key] = saved[key]
    changes.update({k: saved[k] for k in RECORD_FIELDS if k in saved and k not in config.given})
    if "epochs" not in config.given and "epochs" in saved:
        changes["epochs"] = max(saved["epochs"], ckpt["epoch"])
    elif saved.get("schedule", "constant") != "constant" and config.epochs != saved.get("epochs"):
        raise UsageError(f"--resume: the checkpoint's --schedule {saved['schedule']} was planned over --epochs "
                         f"{saved['epochs']}, but --epochs {config.epochs} was given; drop --epochs to continue it")
    config = config.replace(**changes)
    if ckpt["epoch"] > config.epochs:
        raise UsageError(f"--resume: the checkpoint already holds {ckpt['epoch']} epochs, more than --epochs "
                         f"{config.epochs}; pass --epochs >= {ckpt['epoch']}")
    return config, ckpt


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


def restore(impls: dict, ckpt: dict, batch_gen: torch.Generator, device: torch.device) -> None:
    """Load weights, buffers, optimizer states and random streams from ``ckpt`` into a freshly built run."""
    for name, impl in impls.items():
        load_weights_state(impl, {k: v.to(device) for k, v in ckpt["models"][name].items()})
        impl.opt.load_state_dict(ckpt["optimizers"][name])
        if name == "manual":  # a checkpoint of an eager run continued with --cuda-graph, or the reverse
            set_capturable(impl.opt, impl.cuda_graph, tensor_lr=impl.cuda_graph and impl.sched is not None)
        if impl.sched is not None:
            impl.sched.load_state_dict(ckpt["schedulers"][name])
        if getattr(impl, "scaler", None) is not None:
            impl.scaler.load_state_dict(ckpt["scalers"][name])
    torch.set_rng_state(ckpt["rng"]["torch"])
    batch_gen.set_state(ckpt["rng"]["batches"])
    if ckpt["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
