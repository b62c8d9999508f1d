"""TrainConfig: every setting of a training run, validated in one place; the tables of choices it refers to.

The command line (train.py) turns its flags into a TrainConfig; the library functions take a TrainConfig.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from pathlib import Path

import torch

from layers.checks import is_a
from optimizers import OPTIMIZERS

from .errors import UsageError

DATASETS = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}  # name -> torchvision dataset class
TEXT_DATASETS = ("shakespeare",)  # a corpus shipped in training/tasks/corpora (or any file with --data-file)
IMAGE_MODELS = ("mlp", "cnn")
TEXT_MODELS = ("gpt", "lstm", "gru")  # character-level language models
MODELS = IMAGE_MODELS + TEXT_MODELS
IMPLS = ("manual", "engine", "torch")  # hand-written layers, the autodiff engine, nn.Module + autograd
IMPL_GROUPS = {"both": ("manual", "torch"), "all": IMPLS}
DTYPES = ("float32", "float64", "bfloat16", "float16")
# Mixed precision: data and the weights the optimizer updates stay float32, the matrix products run in the half dtype.
HALF_DTYPES = ("bfloat16", "float16")
SCHEDULES = ("constant", "cosine", "onecycle", "warmup-cosine")  # learning rate per step (torch.optim.lr_scheduler);
# warmup-cosine is nanoGPT's: linear warm-up for --warmup-iters, cosine from --lr to --min-lr by --lr-decay-iters
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "zb-h1")  # training/parallel/pipeline_schedules.py
# Settings that determine the numbers a run produces: a resumed run keeps them.
MATH_FIELDS = ("dataset", "model", "impl", "batch_size", "lr", "optimizer", "momentum", "weight_decay", "hidden",
               "depth", "seed", "dtype", "clip_grad", "limit_train", "val_split", "schedule", "augment", "beta2",
               "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "min_lr", "warmup_iters",
               "lr_decay_iters", "eval_interval", "eval_iters")
# Settings of what a run records: a resumed run keeps them unless they are given again (then the new ones apply).
RECORD_FIELDS = ("log_interval", "val_interval", "monitor")
# Settings that only say where this process finds and puts things, or how it talks: under torchrun the ranks may
# differ in these (every other setting must agree on every rank, training/parallel/agreement.py checks it).
LOCAL_FIELDS = ("data_dir", "download", "device", "out", "overwrite", "resume", "tensorboard", "quiet", "plots")
# Settings of the model-parallel run (training/parallel/run.py)
PARALLEL_FIELDS = ("tensor_parallel", "sequence_parallel", "pipeline_parallel", "pipeline_schedule",
                   "micro_batches", "zero", "check_parity")
MLP_FIELDS = ("hidden", "depth")  # settings of --model mlp only
# Settings of the image runs only, and of the text runs only (a setting of the other kind is refused, never ignored)
IMAGE_FIELDS = ("epochs", "augment", "val_interval", "val_split", "limit_train", "data_dir", "download", "sync_bn")
TEXT_FIELDS = ("max_iters", "eval_interval", "eval_iters", "block_size", "n_layer", "n_head", "n_embd", "dropout",
               "bias", "min_lr", "warmup_iters", "lr_decay_iters", "data_file")
# None in these fields means "the model family's default": the image runs' and the text runs' differ.  The text
# defaults are nanoGPT's CPU configuration for Shakespeare (its README: batch 12, AdamW, weight decay 0.1 on the
# matrices, clip 1.0, beta2 0.99, warm-up then cosine decay).
MODEL_DEFAULTS = {"gpt": {"n_layer": 4}, "lstm": {"hidden": 256, "n_layer": 2}, "gru": {"hidden": 256, "n_layer": 2}}
FAMILY_DEFAULTS = {
    "image": {"dataset": "fashion-mnist", "model": "mlp", "batch_size": 128, "optimizer": "adam", "weight_decay": 0.0,
              "clip_grad": None, "schedule": "constant", "beta2": 0.999, "hidden": 1024},
    "text": {"dataset": "shakespeare", "model": "gpt", "batch_size": 12, "optimizer": "adamw", "weight_decay": 0.1,
             "clip_grad": 1.0, "schedule": "warmup-cosine", "beta2": 0.99, "hidden": 1024},
}
SEEDS = (-2 ** 63, 2 ** 64 - 1)  # what torch.manual_seed takes; derived seeds wrap modulo 2**64 as torch's do
MAX_DIST_TIMEOUT = 1e7  # seconds (116 days): "no timeout" is a hang nobody is told about, so there is a bound


def flag(name: str) -> str:
    """The command-line spelling of a field: batch_size -> --batch-size."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class TrainConfig:
    # None: the family's default (FAMILY_DEFAULTS); the family follows --model, or --dataset when --model is unset
    dataset: str | None = None       # images: fashion-mnist (the README's install provides it); text: shakespeare
    data_dir: Path = Path("data")
    download: bool = True            # try torchvision's download for missing files
    model: str | None = None         # images: mlp; text: gpt
    impl: str = "both"               # one of IMPLS or IMPL_GROUPS
    epochs: int = 10
    batch_size: int | None = None    # images 128, text 12 (windows)
    lr: float = 1e-3
    optimizer: str | None = None     # images adam, text adamw
    momentum: float = 0.0
    weight_decay: float | None = None  # images 0, text 0.1 (text: on the matrices only, nanoGPT's groups)
    schedule: str | None = None      # images constant; text warmup-cosine
    beta2: float | None = None       # Adam's/AdamW's second-moment decay: images 0.999 (torch's), text 0.99
    augment: bool = False            # random flips and 2-pixel shifts of training images
    hidden: int | None = None        # the MLP's width (1024); the recurrent models' hidden size (256)
    depth: int = 3
    seed: int = 0
    device: str = "auto"
    threads: int | None = None       # torch.set_num_threads for the run; None: chosen from the load (threads.py)
    dtype: str = "float32"
    log_interval: int = 50
    val_interval: int = 1
    val_split: int | float | None = None  # held out: a count of samples, or a fraction in [0, 1); None: 10%
    clip_grad: float | None = None   # images: none; text: 1.0
    limit_train: int | None = None
    # text runs (character-level language models), nanoGPT's option names and CPU configuration
    data_file: Path | None = None    # any UTF-8 text instead of the --dataset corpus
    max_iters: int = 2000
    eval_interval: int = 250         # iterations between evaluations (and checkpoints)
    eval_iters: int | str = 20       # batches per split and evaluation, or "all": every non-overlapping window
    block_size: int = 64
    n_layer: int | None = None       # GPT blocks (4), or stacked recurrent layers (2)
    n_head: int = 4
    n_embd: int = 128                # the GPT's width; the recurrent models' embedding width
    dropout: float = 0.0
    bias: bool = False
    min_lr: float = 1e-4
    warmup_iters: int = 100
    lr_decay_iters: int = 2000
    cuda_graph: bool | None = None   # capture the hand-written step as a CUDA graph; None: on CUDA where allowed
    compile: bool = False            # torch.compile the hand-written step as one graph, and the twin's model
    compile_fast: bool = False       # --compile fast: that step's guards skipped where proven safe (compiled_fast.py)
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
    # model parallelism of the GPT under torchrun (training/parallel/run.py): T x P ranks a replica, data over the rest
    tensor_parallel: int = 1         # T: each block's heads and widths, and the vocabulary, split over T ranks
    sequence_parallel: bool = False  # with T > 1: layer norms and residuals on T/T positions a rank
    pipeline_parallel: int = 1       # P: the blocks cut into P stages
    pipeline_schedule: str = "1f1b"  # one of PIPELINE_SCHEDULES
    micro_batches: int = 1           # M: a pipelined step's micro-batches
    zero: int = 0                    # ZeRO stage over the data-parallel ranks: 0 (all-reduce), 1 or 2
    check_parity: bool = False       # the first step sharded and in one process, compared tensor by tensor
    given: frozenset[str] = field(default=frozenset(), compare=False)  # fields set explicitly by the user

    @property
    def family(self) -> str:
        """"image" or "text": which data, models, loop and defaults the run uses."""
        return family_of(self.model, self.dataset, self.data_file)

    def default_of(self, name: str):
        """The default of setting ``name`` for this run's model and family."""
        return MODEL_DEFAULTS.get(self.model, {}).get(name, FAMILY_DEFAULTS[self.family].get(name, _DEFAULTS[name]))

    @property
    def model_parallel(self) -> bool:
        """Whether the run takes training/parallel/run.py's path: any of the model-parallel settings given."""
        return (self.tensor_parallel > 1 or self.pipeline_parallel > 1 or self.zero > 0 or self.check_parity
                or self.sequence_parallel
                or any(n in self.given for n in PARALLEL_FIELDS))

    @property
    def is_text(self) -> bool:
        return self.family == "text"

    def __post_init__(self):
        family = self.family
        if self.model is None:
            object.__setattr__(self, "model", FAMILY_DEFAULTS[family]["model"])
        for name, value in {**FAMILY_DEFAULTS[family], **MODEL_DEFAULTS.get(self.model, {})}.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        object.__setattr__(self, "optimizer", str(self.optimizer).lower())
        if self.model_parallel and "impl" not in self.given and self.impl == "both":  # the twins are not split
            object.__setattr__(self, "impl", "manual")
        for name in ("data_dir", "out", "resume", "tensorboard", "data_file"):  # str paths from library callers
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

    def val_count(self, n: int) -> int:
        """How many of ``n`` training samples --val-split holds out: a count as given, a fraction of n rounded down
        (0.41 of 300 is 123: the fraction is read as the decimal written, not as 0.41's binary approximation, whose
        product with 300 is 122.99999999999999), 10% rounded down by default."""
        if self.val_split is None:
            return n // 10
        if isinstance(self.val_split, int):
            return self.val_split
        return math.floor(Fraction(repr(self.val_split)) * n)

    def replace(self, **changes) -> "TrainConfig":
        return replace(self, **changes)

    def validate(self) -> None:
        """Raise UsageError naming the first setting that is out of range or unknown."""
        choices = {"dataset": (*DATASETS, *TEXT_DATASETS), "model": MODELS, "impl": (*IMPLS, *IMPL_GROUPS),
                   "dtype": DTYPES, "optimizer": OPTIMIZERS, "schedule": SCHEDULES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise UsageError(f"{flag(name)}: unknown {name} {getattr(self, name)!r}; known: {', '.join(allowed)}")
        self._validate_family()
        from .config_parallel import validate_parallel  # here: that file reads flag() and the schedules from this one
        validate_parallel(self)
        if self.compile_fast and not self.compile:
            raise UsageError("compile_fast=True needs compile=True (on the command line: --compile fast)")
        lowest = {"epochs": 1, "batch_size": 1, "hidden": 1, "depth": 0, "log_interval": 1, "val_interval": 1,
                  "limit_train": 1, "threads": 1, "max_iters": 1, "eval_interval": 1,
                  "block_size": 1, "n_layer": 1, "n_head": 1, "n_embd": 1, "warmup_iters": 0, "lr_decay_iters": 1}
        for name, low in lowest.items():
            value = getattr(self, name)
            if value is None:
                continue
            if not is_a(value, int):
                raise UsageError(f"{flag(name)} must be an integer, got {value!r}")
            if value < low:
                raise UsageError(f"{flag(name)} {value} is out of range (at least {low})")
        _validate_val_split(self.val_split)
        if not is_a(self.seed, int) or not SEEDS[0] <= self.seed <= SEEDS[1]:
            raise UsageError(f"--seed {self.seed} is out of range (an integer from -2**63 to 2**64 - 1)")
        if not (is_a(self.dist_timeout, (int, float)) and 0 < self.dist_timeout <= MAX_DIST_TIMEOUT):
            raise UsageError(f"--dist-timeout {self.dist_timeout} is out of range (need seconds > 0 and at most "
                             f"{MAX_DIST_TIMEOUT:g})")
        largest = torch.finfo(self.torch_dtype).max  # the optimizer computes with these in the weights' dtype
        for name in ("lr", "momentum", "weight_decay", "clip_grad", "min_lr"):
            value = getattr(self, name)
            if value is None:
                continue
            if not (is_a(value, (int, float)) and math.isfinite(value) and value >= 0) \
                    or (name == "clip_grad" and value == 0):
                need = "a positive number" if name == "clip_grad" else "a finite number >= 0"
                raise UsageError(f"{flag(name)} {value} is out of range (need {need})")
            if value > largest:
                weights = str(self.torch_dtype).removeprefix("torch.")
                raise UsageError(f"{flag(name)} {value} is out of range (at most {largest:.3g}: the weights are "
                                 f"{weights})")
        if self.model != "mlp":
            for name in MLP_FIELDS:
                if self.model in ("lstm", "gru") and name == "hidden":
                    continue
                if name in self.given or getattr(self, name) != self.default_of(name):
                    raise UsageError(f"{flag(name)} applies to --model mlp only, not --model {self.model}")
        for name, value in (("beta2", self.beta2), ("dropout", self.dropout)):
            if not is_a(value, (int, float)) or not 0.0 <= value < 1.0:
                raise UsageError(f"{flag(name)} {value} is out of range (need a number in [0, 1))")
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


VAL_SPLIT_FORMS = "a count of samples (6000), a fraction in [0, 1) (0.1) or a percentage below 100% (10%)"


def parse_val_split(text: str) -> int | float:
    """--val-split's text: "6000" (a count of samples), "0.1" (a fraction) or "10%" (a percentage, read as the
    fraction 0.1).  ValueError naming the forms it takes."""
    try:
        if text.endswith("%"):
            percent = Fraction(text[:-1])
            if not 0 <= percent < 100:
                raise ValueError
            return float(percent / 100)
        if text.strip().lstrip("+-").isdigit():
            return int(text)
        return float(text)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"invalid value {text!r}: give {VAL_SPLIT_FORMS}") from None


def _validate_val_split(value) -> None:
    if value is None:
        return
    if not is_a(value, (int, float)):
        raise UsageError(f"--val-split must be {VAL_SPLIT_FORMS}, got {value!r}")
    if isinstance(value, int) and value < 0:
        raise UsageError(f"--val-split {value} is out of range (a count of samples is at least 0)")
    if isinstance(value, float) and not 0 <= value < 1:
        raise UsageError(f"--val-split {value} is out of range (a fraction must be in [0, 1); for a count of samples "
                         f"give an integer, such as 6000)")


def family_of(model: str | None, dataset: str | None, data_file: object = None) -> str:
    """"text" for the language models (or, with no --model, a text corpus), else "image"."""
    if model is not None:
        return "text" if model in TEXT_MODELS else "image"
    return "text" if data_file is not None or dataset in TEXT_DATASETS else "image"


def _validate_family(self: TrainConfig) -> None:
    """The data fits the model, and no setting of the other family is given: one is refused, never ignored."""
    if self.is_text:
        if self.dataset not in TEXT_DATASETS:
            raise UsageError(f"--model {self.model} is a language model: it trains on text (--dataset "
                             f"{', '.join(TEXT_DATASETS)}, or --data-file PATH), not --dataset {self.dataset}")
        if self.model == "gpt" and self.n_embd % self.n_head:
            raise UsageError(f"--n-embd {self.n_embd} is not divisible by --n-head {self.n_head}")
        if not (self.eval_iters == "all" or (is_a(self.eval_iters, int) and self.eval_iters >= 1)):
            raise UsageError(f"--eval-iters {self.eval_iters!r} is out of range (an integer >= 1, or all)")
        for name in ("n_head", "bias") if self.model != "gpt" else ():
            if name in self.given:
                raise UsageError(f"{flag(name)} applies to --model gpt only, not --model {self.model}")
        wrong, kind = [n for n in IMAGE_FIELDS if n in self.given or getattr(self, n) != self.default_of(n)], "image"
    else:
        if self.dataset in TEXT_DATASETS:
            raise UsageError(f"--dataset {self.dataset} is text: train it with a language model (--model "
                             f"{', '.join(TEXT_MODELS)}), not --model {self.model}")
        if self.schedule == "warmup-cosine":
            raise UsageError("--schedule warmup-cosine is the text runs' (its --warmup-iters, --min-lr and "
                             "--lr-decay-iters count iterations); the image runs take constant, cosine or onecycle")
        wrong, kind = [n for n in TEXT_FIELDS if n in self.given or getattr(self, n) != self.default_of(n)], "text"
    if wrong:
        models = ", ".join(TEXT_MODELS if kind == "text" else IMAGE_MODELS)
        raise UsageError(f"{flag(wrong[0])} applies to the {kind} models ({models}), not --model {self.model}"
                         + ("; a text run counts --max-iters and evaluates every --eval-interval" if kind == "image"
                            else ""))


TrainConfig._validate_family = _validate_family


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
