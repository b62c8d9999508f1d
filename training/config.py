"""TrainConfig: every setting of a training run, validated in one place; the tables of choices it refers to.

The command line (train.py) turns its flags into a TrainConfig; the library functions take a TrainConfig.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch

from optimizers import OPTIMIZERS

from .errors import UsageError

DATASETS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}  # name -> torchvision dataset class
MODELS = ("mlp", "cnn")
IMPLS = ("manual", "engine", "torch")  # hand-written layers, the autodiff engine, nn.Module + autograd
IMPL_GROUPS = {"both": ("manual", "torch"), "all": IMPLS}
DTYPES = ("float32", "float64", "bfloat16", "float16")
# Mixed precision: data and the weights the optimizer updates stay float32, the matrix products run in the half dtype.
HALF_DTYPES = ("bfloat16", "float16")
SCHEDULES = ("constant", "cosine", "onecycle")  # learning-rate schedules (torch.optim.lr_scheduler), per step
# Settings that determine the numbers a run produces: a resumed run keeps them.
MATH_FIELDS = ("dataset", "model", "impl", "batch_size", "lr", "optimizer", "momentum", "weight_decay", "hidden",
               "depth", "seed", "dtype", "clip_grad", "limit_train", "val_split", "schedule", "augment")
# Settings of what a run records: a resumed run keeps them unless they are given again (then the new ones apply).
RECORD_FIELDS = ("log_interval", "val_interval", "monitor")
# Settings that only say where this process finds and puts things, or how it talks: under torchrun the ranks may
# differ in these (every other setting must agree on every rank, training/agreement.py checks it).
LOCAL_FIELDS = ("data_dir", "download", "device", "out", "overwrite", "resume", "tensorboard", "quiet", "plots")
MLP_FIELDS = ("hidden", "depth")  # settings of --model mlp only
SEEDS = (-2 ** 63, 2 ** 64 - 1)  # what torch.manual_seed takes; derived seeds wrap modulo 2**64 as torch's do
MAX_DIST_TIMEOUT = 1e7  # seconds (116 days): "no timeout" is a hang nobody is told about, so there is a bound


def flag(name: str) -> str:
    """The command-line spelling of a field: batch_size -> --batch-size."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class TrainConfig:
    dataset: str = "fashion-mnist"   # what the README's install provides (Debian's package); mnist is downloaded
    data_dir: Path = Path("data")
    download: bool = True            # try torchvision's download for missing files
    model: str = "mlp"
    impl: str = "both"               # one of IMPLS or IMPL_GROUPS
    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    optimizer: str = "adam"
    momentum: float = 0.0
    weight_decay: float = 0.0
    schedule: str = "constant"       # lr over the run: constant, cosine (to 0), onecycle (warm up to lr, anneal)
    augment: bool = False            # random flips and 2-pixel shifts of training images
    hidden: int = 1024
    depth: int = 3
    seed: int = 0
    device: str = "auto"
    threads: int | None = None       # torch.set_num_threads for the run; None: torch's choice (use_threads)
    dtype: str = "float32"
    log_interval: int = 50
    val_interval: int = 1
    val_split: int | None = None     # None: 10% of the training samples
    clip_grad: float | None = None
    limit_train: int | None = None
    cuda_graph: bool | None = None   # capture the hand-written step as a CUDA graph; None: on CUDA where allowed
    monitor: bool = False            # GradientMonitor on every implementation (training/monitors.py)
    tensorboard: Path | None = None  # also write scalars and histograms there for TensorBoard
    out: Path | None = None          # None: runs/<timestamp>, or the checkpoint's folder when resuming
    overwrite: bool = False          # a fresh run may replace the run already in --out (else that is refused)
    resume: Path | None = None
    dry_run: bool = False
    quiet: bool = False
    plots: bool = True               # render PNG figures at the end
    dist_timeout: float = 120.0      # seconds a collective may wait under torchrun before the run fails
    sync_bn: bool = True             # under torchrun: batch statistics over the global batch (SyncBatchNorm)
    given: frozenset[str] = field(default=frozenset(), compare=False)  # fields set explicitly by the user

    def __post_init__(self):
        object.__setattr__(self, "optimizer", str(self.optimizer).lower())
        for name in ("data_dir", "out", "resume", "tensorboard"):  # accept str paths from library callers
            value = getattr(self, name)
            if value is not None:
                if str(value) == "":  # Path("") is the current folder: never what an empty argument meant
                    raise UsageError(f"{flag(name)} is empty; give a path")
                object.__setattr__(self, name, Path(value))
        self.validate()

    @property
    def impls(self) -> tuple[str, ...]:
        return IMPL_GROUPS.get(self.impl, (self.impl,))

    @property
    def is_mixed(self) -> bool:
        """--dtype bfloat16/float16: mixed precision (float32 data and master weights, half matrix products)."""
        return self.dtype in HALF_DTYPES

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype of the data and of the weights the optimizer updates: float32 in a mixed-precision run."""
        return torch.float32 if self.is_mixed else getattr(torch, self.dtype)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the models' matrix products run in: --dtype itself (the half dtype of a mixed run)."""
        return getattr(torch, self.dtype)

    def replace(self, **changes) -> "TrainConfig":
        return replace(self, **changes)

    def validate(self) -> None:
        """Raise UsageError naming the first setting that is out of range or unknown."""
        choices = {"dataset": DATASETS, "model": MODELS, "impl": (*IMPLS, *IMPL_GROUPS), "dtype": DTYPES,
                   "optimizer": OPTIMIZERS, "schedule": SCHEDULES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise UsageError(f"{flag(name)}: unknown {name} {getattr(self, name)!r}; known: {', '.join(allowed)}")
        lowest = {"epochs": 1, "batch_size": 1, "hidden": 1, "depth": 0, "log_interval": 1, "val_interval": 1,
                  "val_split": 0, "limit_train": 1, "threads": 1}
        for name, low in lowest.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"{flag(name)} must be an integer, got {value!r}")
            if value < low:
                raise UsageError(f"{flag(name)} {value} is out of range (at least {low})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not SEEDS[0] <= self.seed <= SEEDS[1]:
            raise UsageError(f"--seed {self.seed} is out of range (an integer from -2**63 to 2**64 - 1)")
        if not (isinstance(self.dist_timeout, (int, float)) and 0 < self.dist_timeout <= MAX_DIST_TIMEOUT):
            raise UsageError(f"--dist-timeout {self.dist_timeout} is out of range (need seconds > 0 and at most "
                             f"{MAX_DIST_TIMEOUT:g})")
        largest = torch.finfo(self.torch_dtype).max  # the optimizer computes with these in the weights' dtype
        for name in ("lr", "momentum", "weight_decay", "clip_grad"):
            value = getattr(self, name)
            if value is None:
                continue
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0) \
                    or (name == "clip_grad" and value == 0):
                need = "a positive number" if name == "clip_grad" else "a finite number >= 0"
                raise UsageError(f"{flag(name)} {value} is out of range (need {need})")
            if value > largest:
                weights = str(self.torch_dtype).removeprefix("torch.")
                raise UsageError(f"{flag(name)} {value} is out of range (at most {largest:.3g}: the weights are "
                                 f"{weights})")
        if self.model != "mlp":
            for name in MLP_FIELDS:
                if name in self.given or getattr(self, name) != _DEFAULTS[name]:
                    raise UsageError(f"{flag(name)} applies to --model mlp only, not --model {self.model}")
        if self.momentum and self.optimizer not in ("sgd", "rmsprop"):
            raise UsageError(f"--momentum applies to sgd and rmsprop, not {self.optimizer}")
        if self.model != "mlp" and "engine" in self.impls:
            raise UsageError(f"--impl {self.impl}: the autodiff engine builds only the MLP, not --model {self.model}; "
                             f"use --impl manual, torch or both")
        if self.is_mixed and "engine" in self.impls:
            raise UsageError(f"--impl {self.impl}: the autodiff engine has no mixed precision (--dtype {self.dtype}); "
                             f"use --impl manual, torch or both, or --dtype float32")
        unknown = set(self.given) - {f.name for f in fields(self)}
        if unknown:
            raise UsageError(f"unknown settings given: {', '.join(sorted(unknown))}")


def use_threads(threads: int | None) -> int:
    """torch.set_num_threads(threads) unless None; -> how many threads torch's CPU operations use now."""
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


_DEFAULTS = {f.name: f.default for f in fields(TrainConfig)}


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; anything else is checked and must exist here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise UsageError(f"--device {name!r} is not a device ({e})") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {name}: only cpu and cuda are supported, not {device.type}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name} asked for CUDA, but torch {torch.__version__} sees no CUDA device here; "
                         f"use --device cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: there are only {torch.cuda.device_count()} CUDA devices here")
    return device
