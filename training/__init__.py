"""The training library behind train.py: configuration, data, the implementations side by side, the loop,
checkpoints, figures, and the data-parallel pieces.  ``training.run(TrainConfig(...))`` is a whole run.
"""
from .agreement import RanksDisagree, check_ranks_agree
from .checkpoint import FORMAT, load_checkpoint, read_checkpoint, save_checkpoint
from .checksum import ChecksumMismatch, seal, unseal
from .config import (DATASETS, TEXT_DATASETS, TEXT_MODELS, DTYPES, HALF_DTYPES, IMPL_GROUPS, IMPLS, MATH_FIELDS, MODELS, SCHEDULES, TrainConfig,
                     resolve_device)
from .data import Data, load_data, prepare_raw, read_split
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, NonFiniteLoss, RunFailed, UsageError
from .files import WriteFailed, atomic_write, atomic_write_bytes, atomic_write_text
from .fingerprint import fingerprint
from .lock import FolderBusy, FolderLock
from .impls import EngineImpl, Impl, ManualImpl, TorchImpl, build_impls, max_param_abs_diff
from .loop import evaluate, train_epoch
from .models import build_models
from .output import OutputFolder
from .trainer import run

__all__ = ["TrainConfig", "run", "resolve_device", "DATASETS", "TEXT_DATASETS", "TEXT_MODELS", "MODELS", "SCHEDULES", "DTYPES",
           "HALF_DTYPES", "IMPLS", "IMPL_GROUPS", "MATH_FIELDS",
           "Data", "load_data", "prepare_raw", "read_split", "Impl", "ManualImpl", "EngineImpl", "TorchImpl",
           "build_impls", "build_models", "max_param_abs_diff", "train_epoch", "evaluate", "FORMAT",
           "save_checkpoint", "load_checkpoint", "read_checkpoint", "seal", "unseal", "ChecksumMismatch",
           "fingerprint", "FolderLock", "FolderBusy", "OutputFolder", "RanksDisagree", "check_ranks_agree",
           "atomic_write", "atomic_write_bytes", "atomic_write_text", "WriteFailed",
           "UsageError", "RunFailed", "NonFiniteLoss", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_INTERRUPTED"]
