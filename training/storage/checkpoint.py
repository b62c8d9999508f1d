"""Checkpoints: everything a run needs to continue exactly (weights, buffers, optimizer state, random
streams, the log so far, the fingerprint of the data), written atomically after every epoch, sealed with the
SHA-256 of their bytes, and read back with the settings they fix.

Reading one checks, before anything is loaded into a model, that its bytes are all there (a file cut short is
called truncated, with the size it has and the size it recorded near its start) and are those that were written
(training/storage/checksum.py), that every field is there and possible (epochs, records, finite weights), and, once
the data is loaded, that it is the data the run was trained on.  Each refusal is one line naming the field.  The
settings a checkpoint holds are read back by training/config/resume.py, its implementations' states by
training/impls/state.py (tensors of the model's shapes, step counts within its epochs).

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

from ..errors import UsageError
from .checksum import SEAL_BYTES, ChecksumMismatch, ends_whole, seal, unseal
from .files import atomic_write_bytes
from .fingerprint import difference

FORMAT = "handgrad-train-5"
# Version 1 stored the settings under "args" and had no --model; versions 1 and 2 have no checksum and no data
# fingerprint (they are read without those checks).  Versions 1 to 3 were written when a hand-written Linear
# exposed its weight as (in, out), and versions 1 to 4 when the autodiff engine's Linear did: their optimizer
# state for those Linear weights is transposed on load.  Version 5 records the file's own size (SIZE_KEY).
READABLE_FORMATS = ("handgrad-train-1", "handgrad-train-2", "handgrad-train-3", "handgrad-train-4", FORMAT)
SEALED_FORMATS = ("handgrad-train-3", "handgrad-train-4", FORMAT)  # written with a checksum
TRANSPOSED_LINEAR_STATE = {
    "handgrad-train-1": ("manual", "engine"),
    "handgrad-train-2": ("manual", "engine"),
    "handgrad-train-3": ("manual", "engine"),
    "handgrad-train-4": ("engine",),
}

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


def checkpoint_state(
    settings: dict,
    impls_state: dict,
    epoch: int,
    records: list,
    batch_gen: torch.Generator,
    data_fingerprint: dict | None = None,
) -> dict:
    """A checkpoint's contents: the settings it resumes with, the implementations' states (``models``,
    ``optimizers``, ``schedulers``, ``scalers``: impls.state.impls_state), the random streams and the log so far."""
    return {
        "format": FORMAT,
        "epoch": epoch,
        "data": data_fingerprint or {},
        "config": settings,
        **impls_state,
        "rng": {
            "torch": torch.get_rng_state(),
            "batches": batch_gen.get_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
        "records": records,  # every metrics.jsonl line so far
    }


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
    if not data:
        raise UsageError(
            f"--resume {path} is empty (0 bytes): a checkpoint whose writing never began; resume from "
            f"an intact copy or start again"
        )
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
        raise UsageError(
            f"--resume {path} carries no checksum: it was rewritten by something other than "
            f"training.save_checkpoint, so its contents cannot be vouched for"
        )
    check_fields(ckpt, path)
    ckpt["sha256"] = sha256
    return ckpt


def _refuse_truncated(path: Path, data: bytes) -> None:
    """Raise UsageError for a checkpoint whose end is missing (it begins as a zip archive and does not end as one),
    with the size it recorded where it did (format 5 and later)."""
    expected = recorded_size(data)
    if expected is not None and len(data) < expected:
        raise UsageError(
            f"--resume {path} is truncated: it has {len(data)} bytes, but it was written with "
            f"{expected} (the last {expected - len(data)} are missing: a copy or download cut short?); "
            f"resume from an intact copy or start again"
        )
    raise UsageError(
        f"--resume {path} is truncated: it begins as a checkpoint does (a zip archive) but its "
        f"{len(data)} bytes end before the archive does (a checkpoint written before format 5 does not record its "
        f"size, so how much is missing is unknown); resume from an intact copy or start again"
    )


def _refuse(path: Path, what: str):
    raise UsageError(f"--resume {path}: {what}")


def check_fields(ckpt: dict, path: Path) -> None:
    """Every field a run needs is present, of its type, and possible; else UsageError naming the field."""
    kinds = {
        "epoch": int,
        "config" if "config" in ckpt else "args": dict,
        "models": dict,
        "optimizers": dict,
        "rng": dict,
        "records": list,
    }
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


def saved_model(path: Path) -> str:
    """The --model a checkpoint was trained with; UsageError, as read_checkpoint says it, where the checkpoint cannot
    be read (missing, a folder, truncated, damaged): its problem comes before any flag is checked against it."""
    ckpt = read_checkpoint(path)
    return (ckpt.get("config") or ckpt.get("args") or {}).get("model", "mlp")


def check_data(ckpt: dict, fingerprint: dict, path: Path, data_name: str) -> None:
    """The data loaded now is the data the checkpoint was trained on (checkpoints before format 3 carry no
    fingerprint and are not checked)."""
    saved = ckpt.get("data")
    if not saved:
        return
    differs = difference(saved, fingerprint)
    if differs is not None:
        _refuse(
            path,
            f"the checkpoint was trained on other data than {data_name} holds "
            f"(checkpoint vs now: {differs}); resume with the data it was trained on",
        )
