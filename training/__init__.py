"""The training library behind train.py: the configuration, the trainer and its loop at the top; the rooms below.

    config/     the run's settings in five typed parts, each declared once; the command line derived from them
    impls/      the implementations a run trains side by side (hand-written, engine, nn.Module twin) and their models
    tasks/      what a run trains on: the image and text tasks, their data, sampling from a language model
    storage/    what a run keeps on disk, kept safe: atomic writes, the lock, sealed checkpoints, the data's fingerprint
    parallel/   training under torchrun: the process group, the hand-written all-reduce, model parallelism by hand;
                parallel/verify/ what checks it (parity, the ranks' agreement, the torch twins, the pipeline report)
    precision/  mixed precision by hand: float32 master weights, the loss scaler

``training.run(TrainConfig(...))`` is a whole run.
"""

from .config import (
    DATASETS,
    DTYPES,
    HALF_DTYPES,
    IMPL_GROUPS,
    IMPLS,
    MATH_KEYS,
    MODELS,
    SCHEDULES,
    TEXT_DATASETS,
    TEXT_MODELS,
    DataConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    RunConfig,
    TrainConfig,
)
from .device import resolve_device
from .errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Interrupted,
    NonFiniteLoss,
    RunFailed,
    UsageError,
)
from .impls import EngineImpl, Impl, ManualImpl, TorchImpl, build_impls, max_param_abs_diff
from .impls.models import build_models
from .loop import evaluate, train_epoch
from .parallel.verify.agreement import RanksDisagree, check_ranks_agree
from .storage.checkpoint import FORMAT, read_checkpoint, save_checkpoint
from .storage.checksum import ChecksumMismatch, seal, unseal
from .storage.files import WriteFailed, atomic_write, atomic_write_bytes, atomic_write_text
from .storage.fingerprint import fingerprint
from .storage.lock import FolderBusy, FolderLock
from .storage.output import OutputFolder
from .tasks.image_data import Data, load_data, prepare_raw, read_split
from .trainer import run

__all__ = [
    "TrainConfig",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "ParallelConfig",
    "run",
    "resolve_device",
    "DATASETS",
    "TEXT_DATASETS",
    "TEXT_MODELS",
    "MODELS",
    "SCHEDULES",
    "DTYPES",
    "HALF_DTYPES",
    "IMPLS",
    "IMPL_GROUPS",
    "MATH_KEYS",
    "Data",
    "load_data",
    "prepare_raw",
    "read_split",
    "Impl",
    "ManualImpl",
    "EngineImpl",
    "TorchImpl",
    "build_impls",
    "build_models",
    "max_param_abs_diff",
    "train_epoch",
    "evaluate",
    "FORMAT",
    "save_checkpoint",
    "read_checkpoint",
    "seal",
    "unseal",
    "ChecksumMismatch",
    "fingerprint",
    "FolderLock",
    "FolderBusy",
    "OutputFolder",
    "RanksDisagree",
    "check_ranks_agree",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "WriteFailed",
    "UsageError",
    "RunFailed",
    "NonFiniteLoss",
    "Interrupted",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "EXIT_INTERRUPTED",
]
