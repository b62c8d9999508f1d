"""A training run's configuration: five typed parts, a file each -- what the run trains on (data.py), the model
(model.py), the optimizer and its schedule (optim.py), the run itself: its length, output, resume, precision and
device (run.py), and the model-parallel layout (parallel.py) -- each setting declared once (setting.py), put
together and checked across parts by TrainConfig (train_config.py); train.py's command line derived from the
declarations (command_line.py); a resumed run's settings (resume.py); the tables of choices (choices.py).

Each part checks its own values when it is made; what spans parts (a setting of the other model family, a float
too large for the weights' dtype, a split the model does not divide into) is TrainConfig's to check.  A subsystem
takes the part it reads: the optimizer's set-up an OptimConfig, the models' builders a ModelConfig.
"""

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
from .data import DataConfig, parse_val_split
from .model import ModelConfig
from .optim import OptimConfig
from .parallel import ParallelConfig
from .run import RunConfig
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
