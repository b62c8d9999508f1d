"""A training run's configuration: five typed parts (parts.py), each setting declared once (setting.py), put
together and checked across parts by TrainConfig (train_config.py); train.py's command line derived from the
declarations (command_line.py); a resumed run's settings (resume.py); the tables of choices (choices.py)."""

from .choices import (
    DATASETS,
    DTYPES,
    HALF_DTYPES,
    IMAGE_MODELS,
    IMPL_GROUPS,
    IMPLS,
    MODELS,
    PIPELINE_SCHEDULES,
    SCHEDULES,
    TEXT_DATASETS,
    TEXT_MODELS,
    family_of,
    flag,
)
from .parts import DataConfig, ModelConfig, OptimConfig, ParallelConfig, RunConfig, parse_val_split
from .train_config import LOCAL_KEYS, MATH_KEYS, RECORD_KEYS, SETTINGS, TrainConfig

__all__ = [
    "TrainConfig",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "ParallelConfig",
    "SETTINGS",
    "MATH_KEYS",
    "RECORD_KEYS",
    "LOCAL_KEYS",
    "DATASETS",
    "TEXT_DATASETS",
    "IMAGE_MODELS",
    "TEXT_MODELS",
    "MODELS",
    "IMPLS",
    "IMPL_GROUPS",
    "DTYPES",
    "HALF_DTYPES",
    "SCHEDULES",
    "PIPELINE_SCHEDULES",
    "flag",
    "family_of",
    "parse_val_split",
]
