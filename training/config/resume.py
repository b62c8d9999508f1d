"""A resumed run's configuration: the checkpoint's settings adopted, the flags given checked against them.

A setting that fixes the numbers a run produces (declared ``keeps="math"``) is the checkpoint's: given again with
another value it is refused, naming both.  The settings of what is recorded (``keeps="record"``: --log-interval,
--val-interval, --monitor) are the checkpoint's unless given.  The run's length is the checkpoint's unless given
(--epochs, --max-iters), and a text run keeps its corpus file.  A model-parallel checkpoint resumes with the split
and world size it was written with.  Every refusal is one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from ..errors import UsageError
from .choices import family_of, flag
from .train_config import MATH_KEYS, RECORD_KEYS, SETTINGS, TrainConfig, declared


def _refuse(path: Path, what: str):
    raise UsageError(f"--resume {path}: {what}")


def saved_settings(ckpt: dict) -> dict:
    """The settings a checkpoint was written with, by key, without those of another model than its own (older
    checkpoints stored every setting: a CNN's --hidden, a GPT's)."""
    saved = dict(ckpt.get("config") or ckpt.get("args") or {})
    model = saved.setdefault("model", "mlp")
    family = family_of(model, saved.get("dataset"), saved.get("data_file"))
    return {k: v for k, v in saved.items() if k not in SETTINGS or declared(k).applies_to(model, family)}


def settings_to_save(config: TrainConfig) -> dict:
    """What a checkpoint stores of the settings: those it resumes with, and the run's length (a text run's corpus
    file as a str: checkpoints hold no Path objects, and resolved: resumable from anywhere)."""
    saved = {**config.settings(MATH_KEYS + RECORD_KEYS), "epochs": config.run.epochs}
    if config.is_text:
        data_file = config.data.data_file
        saved.update(max_iters=config.run.max_iters, data_file=None if data_file is None else str(data_file.resolve()))
    return saved


def resumed(config: TrainConfig, ckpt: dict, world_size: int = 1) -> TrainConfig:
    """The config that continues ``ckpt`` (read from ``config.run.resume``) on ``world_size`` processes.

    A checkpoint that already holds every requested epoch is continued as is (the run then only completes its
    outputs).  Settings that fail TrainConfig's checks are refused."""
    path = cast(Path, config.run.resume)  # given: the caller read ``ckpt`` from it
    saved = saved_settings(ckpt)
    length = ("max_iters", "data_file", "epochs")  # how long the run is planned, and (text) on which file
    try:  # the checkpoint's settings on their own, before any flag is set against them
        own = TrainConfig(**{k: saved[k] for k in (*MATH_KEYS, *RECORD_KEYS, *length) if k in saved})
    except (UsageError, TypeError) as e:
        _refuse(path, f"the checkpoint's settings are impossible: {e}")
    now = config.settings()
    changes = {}
    for key in MATH_KEYS:
        if key not in saved:
            continue
        if key in config.given and now[key] != saved[key]:
            raise UsageError(
                f"--resume: the checkpoint was trained with {flag(key)} {saved[key]}, but {flag(key)} "
                f"{now[key]} was given; drop {flag(key)} to continue it"
            )
        changes[key] = saved[key]
    changes.update({k: saved[k] for k in RECORD_KEYS if k in saved and k not in config.given})
    if own.is_text:
        changes.update(_text_length(config, ckpt, own))
    else:
        changes.update(_epochs(config, ckpt, saved))
    config = config.replace(**changes)
    _check_parts(path, config, ckpt)
    return resume_split(config, ckpt, world_size, path)


def _epochs(config: TrainConfig, ckpt: dict, saved: dict) -> dict:
    """An image run's --epochs: the checkpoint's target unless given; never fewer than it holds."""
    epochs = config.run.epochs
    if "epochs" not in config.given and "epochs" in saved:
        epochs = max(saved["epochs"], ckpt["epoch"])
    elif saved.get("schedule", "constant") != "constant" and epochs != saved.get("epochs"):
        raise UsageError(
            f"--resume: the checkpoint's --schedule {saved['schedule']} was planned over --epochs "
            f"{saved['epochs']}, but --epochs {epochs} was given; drop --epochs to continue it"
        )
    if ckpt["epoch"] > epochs:
        raise UsageError(
            f"--resume: the checkpoint already holds {ckpt['epoch']} epochs, more than --epochs "
            f"{epochs}; pass --epochs >= {ckpt['epoch']}"
        )
    return {"epochs": epochs}


def _text_length(config: TrainConfig, ckpt: dict, own: TrainConfig) -> dict:
    """A text run's corpus file (unless given again: the data's fingerprint is checked once it is read) and its
    --max-iters (unless given); a longer run continues a checkpoint whose last round was a whole --eval-interval
    (a shorter last round cannot grow)."""
    changes: dict[str, Any] = {} if "data_file" in config.given else {"data_file": own.data.data_file}
    iters = changes["max_iters"] = config.run.max_iters if "max_iters" in config.given else own.run.max_iters
    interval = own.run.eval_interval
    done = min(ckpt["epoch"] * interval, own.run.max_iters)  # the iterations the checkpoint holds
    if iters < done:
        raise UsageError(
            f"--resume: the checkpoint already holds {done} iterations, more than --max-iters {iters}; "
            f"pass --max-iters >= {done}"
        )
    if iters > done and done % interval:
        raise UsageError(
            f"--resume: the checkpoint's last evaluation came after a short round (iteration {done}, "
            f"not a multiple of --eval-interval {interval}), so the run cannot be continued past "
            f"--max-iters {own.run.max_iters}"
        )
    return changes


def _check_parts(path: Path, config: TrainConfig, ckpt: dict) -> None:
    """The checkpoint holds every implementation's weights, optimizer and (where the run has them) scheduler and
    loss scaler."""
    impls = config.run.impls
    parts = {
        "models": impls,
        "optimizers": impls,
        "schedulers": impls if config.optim.schedule != "constant" else (),
        "scalers": impls if config.run.dtype == "float16" else (),
    }
    for part, names in parts.items():
        for name in names:
            if name not in ckpt.get(part, {}):
                _refuse(path, f"the checkpoint has no '{part}.{name}' (--impl {config.run.impl} needs it)")


def _words(settings: dict) -> str:
    return ", ".join(f"{flag(k)} {v}" if k != "world_size" else f"world size {v}" for k, v in settings.items())


def resume_split(config: TrainConfig, ckpt: dict, world_size: int, path: Path) -> TrainConfig:
    """The config that continues ``ckpt`` (at ``path``) on ``world_size`` processes: a model-parallel checkpoint's
    split settings adopted where not given; one line naming the checkpoint's and this run's values where they
    differ, or where only one of the two is model-parallel."""
    saved = (ckpt.get("model_parallel") or {}).get("settings")
    now = {**config.parallel.split(), "world_size": world_size}
    if saved is None:
        if config.model_parallel:
            raise UsageError(
                f"--resume {path}: the checkpoint was written without model parallelism (world size "
                f"{ckpt.get('world_size', 1)}), this run has {_words(now)}; its optimizer state is not "
                f"cut into shards: resume it as it was trained"
            )
        return config
    # the values given are compared before the others are adopted: a mix of the two could be refused for itself
    differs = [k for k in now if (k in config.given or k == "world_size") and saved.get(k) != now[k]]
    if differs:
        old, new = _words({k: saved.get(k) for k in differs}), _words({k: now[k] for k in differs})
        raise UsageError(
            f"--resume {path}: the checkpoint was written with {old}, this run has {new}; a "
            f"model-parallel checkpoint resumes with the split and world size it was written with"
        )
    adopted = {k: v for k, v in saved.items() if k in now and k != "world_size" and k not in config.given}
    if adopted:
        # the checkpoint's split stays on the model-parallel path even where its settings are all defaults
        config = config.replace(**adopted, given=config.given | {"zero"})
    return config
