"""Checkpoints: everything a run needs to continue exactly (weights, buffers, optimizer state, random
streams, the log so far, the fingerprint of the data), written atomically after every epoch, sealed with the
SHA-256 of their bytes, and read back with the settings they fix.

Reading one checks, before anything is loaded into a model, that its bytes are all there (a file cut short is
called truncated, with the size it has and the size it recorded near its start) and are those that were written
(training/storage/checksum.py), that every field is there and possible (epochs, records, settings that pass
TrainConfig's validation, tensors of the model's shapes, step counts within its epochs), and, once the data is
loaded, that it is the data the run was trained on.  Each refusal is one line naming the field.

A mixed-precision run (--dtype bfloat16/float16) stores float32 weights for every implementation (the manual
run's master weights, not their half rounding) and, for float16, each loss scaler's state (scale and growth
tracker, torch.amp.GradScaler's keys for both).
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import torch

from layers.checks import is_a

from .checksum import SEAL_BYTES, ChecksumMismatch, ends_whole, seal, unseal
from ..config import MATH_FIELDS, MLP_FIELDS, RECORD_FIELDS, TrainConfig, flag
from ..errors import UsageError
from .files import atomic_write_bytes
from .fingerprint import difference
from ..impls import weights_state

FORMAT = "handgrad-train-5"
# Version 1 stored the settings under "args" and had no --model; versions 1 and 2 have no checksum and no data
# fingerprint (they are read without those checks).  Versions 1 to 3 were written when a hand-written Linear
# exposed its weight as (in, out), and versions 1 to 4 when the autodiff engine's Linear did: their optimizer
# state for those Linear weights is transposed on load.  Version 5 records the file's own size (SIZE_KEY).
READABLE_FORMATS = ("handgrad-train-1", "handgrad-train-2", "handgrad-train-3", "handgrad-train-4", FORMAT)
SEALED_FORMATS = ("handgrad-train-3", "handgrad-train-4", FORMAT)  # written with a checksum
TRANSPOSED_LINEAR_STATE = {"handgrad-train-1": ("manual", "engine"), "handgrad-train-2": ("manual", "engine"),
                           "handgrad-train-3": ("manual", "engine"), "handgrad-train-4": ("engine",)}

# The file's length in bytes, as the first entry of the state: torch.save writes the pickled state as the zip
# archive's first record, so the number sits near the start of the file and survives when its end is cut off (a
# copy or download stopped short), where the zip directory and the checksum were.  A fixed width, so that writing
# the number does not change the length it states.
SIZE_KEY = "size"
_SIZE = "handgrad-checkpoint-bytes:{:020d}"
_SIZE_PATTERN = re.compile(rb"handgrad-checkpoint-bytes:(\d{20})")
_ZIP_START = b"PK\x03\x04"  # a zip archive's first local file header, as every torch.save file begins


def save_checkpoint(path: Path, state: dict) -> None:
    """Write ``state`` sealed with its SHA-256, atomically: a crash, Ctrl-C or full disk during the write leaves
    the previous checkpoint whole (and no temporary file; see files.atomic_write).  The state is stored with the
    file's size in front (SIZE_KEY): serialized once to learn the length, then again with it."""
    state = {SIZE_KEY: _SIZE.format(0), **{k: v for k, v in state.items() if k != SIZE_KEY}}
    size = 0
    while True:  # twice: the fixed-width number leaves the length unchanged
        buffer = io.BytesIO()
        torch.save(state, buffer)
        if len(buffer.getvalue()) + SEAL_BYTES == size:
            break
        size = len(buffer.getvalue()) + SEAL_BYTES
        state[SIZE_KEY] = _SIZE.format(size)
    atomic_write_bytes(path, seal(buffer.getvalue()))


def recorded_size(data: bytes) -> int | None:
    """The size a checkpoint of format 5 or later recorded near its start, or None (an older file, or another)."""
    found = _SIZE_PATTERN.search(data[:4096])
    return int(found.group(1)) if found else None


def checkpoint_state(impls: dict, config: TrainConfig, epoch: int, records: list, batch_gen: torch.Generator,
                     data_fingerprint: dict | None = None) -> dict:
    return {
        "format": FORMAT, "epoch": epoch, "data": data_fingerprint or {},
        "config": {**{k: getattr(config, k) for k in MATH_FIELDS + RECORD_FIELDS}, "epochs": config.epochs,
                   **_text_extent(config)},
        "models": {name: weights_state(impl) for name, impl in impls.items()},
        "optimizers": {name: impl.opt.state_dict() for name, impl in impls.items()},
        "schedulers": {name: impl.sched.state_dict() for name, impl in impls.items() if impl.sched is not None},
        "scalers": {name: impl.scaler.state_dict() for name, impl in impls.items()
                    if getattr(impl, "scaler", None) is not None},
        "rng": {"torch": torch.get_rng_state(), "batches": batch_gen.get_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "records": records,  # every metrics.jsonl line so far
    }


def _text_extent(config: TrainConfig) -> dict:
    """A text run's length and corpus file (a str: checkpoints hold no Path objects), kept like --epochs."""
    if not config.is_text:
        return {}
    data_file = None if config.data_file is None else str(Path(config.data_file).resolve())  # resumable from anywhere
    return {"max_iters": config.max_iters, "data_file": data_file}


def read_checkpoint(path: Path) -> dict:
    """The checkpoint at ``path``: its checksum verified before torch.load reads it, then its fields checked
    (``check_fields``).  The digest it was sealed with is added as ``ckpt["sha256"]`` (None for format 1 and 2)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"--resume {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"--resume {path} is a folder; pass the checkpoint.pt inside it") from None
    except OSError as e:
        raise UsageError(f"--resume {path}: cannot read it ({e.strerror})") from None
    try:
        sha256 = unseal(data)
    except ChecksumMismatch as e:
        raise UsageError(f"--resume {path} is damaged: {e}; resume from an intact copy or start again") from None
    if data.startswith(_ZIP_START) and not ends_whole(data):
        _refuse_truncated(path, data)
    try:
        ckpt = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # torch's weights_only explanation is pages long: one line is enough
        first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
        raise UsageError(f"--resume {path} is not a handgrad checkpoint ({type(e).__name__}: {first})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") not in READABLE_FORMATS:
        raise UsageError(f"--resume {path} is not a handgrad train.py checkpoint")
    if sha256 is None and ckpt["format"] in SEALED_FORMATS:
        raise UsageError(f"--resume {path} carries no checksum: it was rewritten by something other than "
                         f"training.save_checkpoint, so its contents cannot be vouched for")
    check_fields(ckpt, path)
    ckpt["sha256"] = sha256
    return ckpt


def _refuse_truncated(path: Path, data: bytes) -> None:
    """Raise UsageError for a checkpoint whose end is missing (it begins as a zip archive and does not end as one),
    with the size it recorded where it did (format 5 and later)."""
    expected = recorded_size(data)
    if expected is not None and len(data) < expected:
        raise UsageError(f"--resume {path} is truncated: it has {len(data)} bytes, but it was written with "
                         f"{expected} (the last {expected - len(data)} are missing: a copy or download cut short?); "
                         f"resume from an intact copy or start again")
    raise UsageError(f"--resume {path} is truncated: it begins as a checkpoint does (a zip archive) but its "
                     f"{len(data)} bytes end before the archive does (a checkpoint written before format 5 does not record its "
                     f"size, so how much is missing is unknown); resume from an intact copy or start again")


def _refuse(path: Path, what: str):
    raise UsageError(f"--resume {path}: {what}")


def check_fields(ckpt: dict, path: Path) -> None:
    """Every field a run needs is present, of its type, and possible; else UsageError naming the field."""
    kinds = {"epoch": int, "config" if "config" in ckpt else "args": dict, "models": dict, "optimizers": dict,
             "rng": dict, "records": list}
    for key, kind in kinds.items():
        if key not in ckpt:
            _refuse(path, f"the checkpoint has no '{key}'")
        if not is_a(ckpt[key], kind):
            _refuse(path, f"'{key}' is of type {type(ckpt[key]).__name__}, not {kind.__name__}")
    epoch = ckpt["epoch"]
    if epoch < 1:
        _refuse(path, f"'epoch' is {epoch}; a checkpoint is written after its first epoch or a later one")
    for i, rec in enumerate(ckpt["records"]):
        rec_epoch = rec.get("epoch") if isinstance(rec, dict) else None
        if not is_a(rec_epoch, int) or not 1 <= rec_epoch <= epoch:
            _refuse(path, f"'records[{i}]' is of epoch {rec_epoch!r}, outside the checkpoint's epochs 1..{epoch}")
    for name, state in ckpt["models"].items():
        if not isinstance(state, dict):
            _refuse(path, f"'models.{name}' is a {type(state).__name__}, not a dict of tensors")
        for key, t in state.items():
            if not isinstance(t, torch.Tensor):
                _refuse(path, f"'models.{name}.{key}' is a {type(t).__name__}, not a tensor")
            if t.is_floating_point() and not torch.isfinite(t).all():
                _refuse(path, f"'models.{name}.{key}' holds inf or nan")
    for key in ("torch", "batches"):
        if not isinstance(ckpt["rng"].get(key), torch.Tensor):
            _refuse(path, f"'rng.{key}' is missing or not a tensor")


def saved_model(path: Path) -> str | None:
    """The --model a checkpoint was trained with, or None where it cannot be read (load_checkpoint then says why)."""
    try:
        ckpt = read_checkpoint(path)
    except UsageError:
        return None
    return (ckpt.get("config") or ckpt.get("args") or {}).get("model", "mlp")


def load_checkpoint(path: Path, config: TrainConfig) -> tuple[TrainConfig, dict]:
    """Read a checkpoint (``read_checkpoint``); return the config it continues (its settings adopted) and it.

    A setting given explicitly that differs from the checkpoint's is an error naming both values (for the
    settings of what is recorded, --log-interval, --val-interval, --monitor, the given value applies).  Without
    --epochs the run's own target is kept; a checkpoint that already holds every requested epoch is returned as
    is (the run then only completes its outputs).  Settings that fail TrainConfig's validation are refused.
    """
    ckpt = read_checkpoint(path)
    saved = dict(ckpt.get("config") or ckpt["args"])
    saved.setdefault("model", "mlp")
    if saved["model"] != "mlp":  # checkpoints before the MLP's settings were refused for the CNN kept them
        for key in MLP_FIELDS:
            saved.pop(key, None)
    length = ("max_iters", "data_file", "epochs")  # how long the run is planned, and (text) on which file
    try:  # the checkpoint's settings on their own, before any flag is set against them
        own = TrainConfig(**{k: saved[k] for k in (*MATH_FIELDS, *RECORD_FIELDS, *length) if k in saved})
    except (UsageError, TypeError) as e:
        _refuse(path, f"the checkpoint's settings are impossible: {e}")
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
    if own.is_text:
        return _resume_text(path, config, ckpt, own, changes)
    if "epochs" not in config.given and "epochs" in saved:
        changes["epochs"] = max(saved["epochs"], ckpt["epoch"])
    elif saved.get("schedule", "constant") != "constant" and config.epochs != saved.get("epochs"):
        raise UsageError(f"--resume: the checkpoint's --schedule {saved['schedule']} was planned over --epochs "
                         f"{saved['epochs']}, but --epochs {config.epochs} was given; drop --epochs to continue it")
    config = config.replace(**changes)
    if ckpt["epoch"] > config.epochs:
        raise UsageError(f"--resume: the checkpoint already holds {ckpt['epoch']} epochs, more than --epochs "
                         f"{config.epochs}; pass --epochs >= {ckpt['epoch']}")
    _check_parts(path, config, ckpt)
    return config, ckpt


def _resume_text(path: Path, config: TrainConfig, ckpt: dict, own: TrainConfig,
                 changes: dict) -> tuple[TrainConfig, dict]:
    """load_checkpoint for a text run: its corpus file is kept unless given again (the data's fingerprint is
    checked once it is read), its --max-iters unless given; a longer run continues a checkpoint whose last round
    was a whole --eval-interval (a shorter last round cannot grow)."""
    if "data_file" not in config.given:
        changes["data_file"] = own.data_file
    iters = changes["max_iters"] = config.max_iters if "max_iters" in config.given else own.max_iters
    done = min(ckpt["epoch"] * own.eval_interval, own.max_iters)  # the iterations the checkpoint holds
    if iters < done:
        raise UsageError(f"--resume: the checkpoint already holds {done} iterations, more than --max-iters {iters}; "
                         f"pass --max-iters >= {done}")
    if iters > done and done % own.eval_interval:
        raise UsageError(f"--resume: the checkpoint's last evaluation came after a short round (iteration {done}, "
                         f"not a multiple of --eval-interval {own.eval_interval}), so the run cannot be continued "
                         f"past --max-iters {own.max_iters}")
    config = config.replace(**changes)
    _check_parts(path, config, ckpt)
    return config, ckpt


def _check_parts(path: Path, config: TrainConfig, ckpt: dict) -> None:
    """The checkpoint holds every implementation's weights, optimizer and (where the run has them) scheduler and
    loss scaler."""
    parts = {"models": config.impls, "optimizers": config.impls,
             "schedulers": config.impls if config.schedule != "constant" else (),
             "scalers": config.impls if config.dtype == "float16" else ()}
    for part, names in parts.items():
        for name in names:
            if name not in ckpt.get(part, {}):
                _refuse(path, f"the checkpoint has no '{part}.{name}' (--impl {config.impl} needs it)")


def check_data(ckpt: dict, fingerprint: dict, path: Path, data_name: str) -> None:
    """The data loaded now is the data the checkpoint was trained on (checkpoints before format 3 carry no
    fingerprint and are not checked)."""
    saved = ckpt.get("data")
    if not saved:
        return
    differs = difference(saved, fingerprint)
    if differs is not None:
        _refuse(path, f"the checkpoint was trained on other data than {data_name} holds "
                      f"(checkpoint vs now: {differs}); resume with the data it was trained on")
