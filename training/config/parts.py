"""The configuration's five parts, each setting declared once (setting.py): what the run trains on (DataConfig),
the model (ModelConfig), the optimizer and its schedule (OptimConfig), the run itself -- its length, output,
resume, precision and device (RunConfig) -- and the model-parallel layout (ParallelConfig).

Each part checks its own values when it is made; what spans parts (a setting of the other model family, a float
too large for the weights' dtype, a split the model does not divide into) is TrainConfig's to check
(train_config.py).  A subsystem takes the part it reads: the optimizer's set-up an OptimConfig, the models'
builders a ModelConfig.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import cast

import torch

from layers.checks import is_a
from optimizers import OPTIMIZERS

from ..errors import UsageError
from .choices import (
    DATASETS,
    DTYPES,
    HALF_DTYPES,
    IMPL_GROUPS,
    IMPLS,
    MAX_DIST_TIMEOUT,
    MODELS,
    PIPELINE_SCHEDULES,
    SCHEDULES,
    SEEDS,
    TEXT_DATASETS,
    flag,
)
from .setting import check_part, per_model, setting

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


def parse_eval_iters(text: str) -> int | str:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"invalid value {text!r}: an integer or all") from None


def _check_fraction(name: str, value) -> None:
    if not is_a(value, (int, float)) or not 0.0 <= value < 1.0:
        raise UsageError(f"{flag(name)} {value} is out of range (need a number in [0, 1))")


@dataclass(frozen=True)
class DataConfig:
    """What a run trains on, and how it is cut into batches and splits."""

    dataset: str = setting(
        per_model(image="fashion-mnist", text="shakespeare"),
        "{image} (the default for the image models): from --data-dir, else Debian's dataset-fashion-mnist package "
        "(the README's install), else downloaded; mnist: from --data-dir, else downloaded; {text} (the default for "
        "the language models): the corpus shipped in training/tasks/corpora",
        choices=(*DATASETS, *TEXT_DATASETS),
        keeps="math",
    )
    data_file: Path | None = setting(
        None, "text runs: train on this UTF-8 file instead", type=Path, metavar="PATH", applies=("text",)
    )
    data_dir: Path = setting(
        Path("data"),
        "torchvision's layout, DIR/MNIST/raw and DIR/FashionMNIST/raw; files found "
        "elsewhere are decompressed into it (default: data, in the current folder)",
        type=Path,
        local=True,
        applies=("image",),
    )
    download: bool = setting(
        True, "never try the network for missing files", type=bool, form="negated", local=True, applies=("image",)
    )
    batch_size: int = setting(
        per_model(image=128, text=12),
        "samples per step, under torchrun the global batch (default: {image} images, {text} windows of text)",
        type=int,
        low=1,
        keeps="math",
    )
    augment: bool = setting(
        False,
        "random left-right flips and 2-pixel shifts of training images",
        type=bool,
        form="switch",
        keeps="math",
        applies=("image",),
    )
    val_split: int | float | None = setting(
        None,
        "training samples held out for validation: a count (6000), a fraction (0.1) or a percentage (10%%) of "
        "them (default: 10%%; 0: none)",
        type=(int, float),
        parse=parse_val_split,
        metavar="N|FRACTION|PERCENT",
        keeps="math",
        applies=("image",),
    )
    limit_train: int | None = setting(
        None,
        "use the first N training samples (default: all)",
        type=int,
        low=1,
        metavar="N",
        keeps="math",
        applies=("image",),
    )

    def __post_init__(self):
        check_part(self)
        value = self.val_split
        if value is None:
            return
        if not is_a(value, (int, float)):
            raise UsageError(f"--val-split must be {VAL_SPLIT_FORMS}, got {value!r}")
        if isinstance(value, int) and value < 0:
            raise UsageError(f"--val-split {value} is out of range (a count of samples is at least 0)")
        if isinstance(value, float) and not 0 <= value < 1:
            raise UsageError(
                f"--val-split {value} is out of range (a fraction must be in [0, 1); for a count of "
                f"samples give an integer, such as 6000)"
            )

    def val_count(self, n: int) -> int:
        """How many of ``n`` training samples --val-split holds out: a count as given, a fraction of n rounded down
        (0.41 of 300 is 123: the fraction is read as the decimal written, not as 0.41's binary approximation, whose
        product with 300 is 122.99999999999999), 10% rounded down by default."""
        if self.val_split is None:
            return n // 10
        if isinstance(self.val_split, int):
            return self.val_split
        return math.floor(Fraction(repr(self.val_split)) * n)


@dataclass(frozen=True)
class ModelConfig:
    """The model: which one, and its size."""

    name: str = setting(
        per_model(image="mlp", text="gpt"),
        "{image}: the default Net (the default with an image dataset); cnn: the CNN; {text}: a character-level GPT "
        "(the default with a text corpus); lstm, gru: character-level recurrent language models",
        key="model",
        choices=MODELS,
        keeps="math",
    )
    hidden: int | None = setting(
        per_model(mlp=1024, recurrent=256),
        "the MLP's hidden width, or the lstm/gru's hidden size (default: {mlp} for the MLP, {recurrent} for lstm/gru)",
        type=int,
        low=1,
        keeps="math",
        applies=("mlp", "lstm", "gru"),
    )
    depth: int = setting(3, "number of MLP hidden layers", type=int, low=0, keeps="math", applies=("mlp",))
    sync_bn: bool = setting(
        True,
        "under torchrun: per-process batch norm statistics (the twin then uses plain "
        "BatchNorm under DDP) instead of synchronised ones",
        type=bool,
        form="negated",
        applies=("image",),
    )
    block_size: int = setting(
        64, "context length: characters per window", type=int, low=1, group="text", keeps="math", applies=("text",)
    )
    n_layer: int | None = setting(
        per_model(gpt=4, recurrent=2),
        "GPT blocks, or stacked recurrent layers (default: {gpt} for gpt, {recurrent} for lstm/gru)",
        type=int,
        low=1,
        group="text",
        keeps="math",
        applies=("text",),
    )
    n_head: int = setting(4, "GPT attention heads", type=int, low=1, group="text", keeps="math", applies=("gpt",))
    n_embd: int = setting(
        128,
        "GPT width, or the recurrent models' embedding width",
        type=int,
        low=1,
        group="text",
        keeps="math",
        applies=("text",),
    )
    dropout: float = setting(0.0, "dropout probability", type=float, group="text", keeps="math", applies=("text",))
    bias: bool = setting(
        False,
        "biases in the GPT's Linears and LayerNorms (default: off, as in nanoGPT's train.py)",
        type=bool,
        form="either",
        group="text",
        keeps="math",
        applies=("gpt",),
    )
    n_experts: int = setting(
        0,
        "each block's MLP a mixture of K experts (C -> 4C -> C each) behind a softmax router; 0: the dense MLP",
        type=int,
        low=0,
        metavar="K",
        group="text",
        keeps="math",
        applies=("gpt",),
    )
    top_k: int = setting(
        2,
        "with --n-experts: the experts each token is sent to",
        type=int,
        low=1,
        group="text",
        keeps="math",
        applies=("gpt",),
    )
    capacity_factor: float = setting(
        1.25,
        "with --n-experts: an expert takes at most ceil(F top_k N / K) of a batch's N tokens, the rest dropped "
        "(passed on by the residual)",
        type=float,
        metavar="F",
        group="text",
        keeps="math",
        applies=("gpt",),
    )
    aux_coef: float = setting(
        0.01,
        "with --n-experts: the weight of the load-balancing loss K sum_e f_e P_e (Switch's, Mixtral's) added to "
        "the loss",
        type=float,
        group="text",
        keeps="math",
        applies=("gpt",),
    )

    def __post_init__(self):
        check_part(self)
        _check_fraction("dropout", self.dropout)
        if self.name == "gpt" and self.n_embd % self.n_head:
            raise UsageError(f"--n-embd {self.n_embd} is not divisible by --n-head {self.n_head}")
        if self.n_experts and self.top_k > self.n_experts:
            raise UsageError(f"--top-k {self.top_k} is more than --n-experts {self.n_experts}")
        if self.n_experts and not (self.capacity_factor > 0 and math.isfinite(self.capacity_factor)):
            raise UsageError(f"--capacity-factor {self.capacity_factor} is out of range (a positive number)")
        if self.n_experts and not (self.aux_coef >= 0 and math.isfinite(self.aux_coef)):
            raise UsageError(f"--aux-coef {self.aux_coef} is out of range (a number >= 0)")


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer, its hyper-parameters and the learning rate's schedule."""

    lr: float = setting(1e-3, "learning rate (the peak, with --schedule onecycle)", type=float, keeps="math")
    optimizer: str = setting(
        per_model(image="adam", text="adamw"),
        "one of " + ", ".join(OPTIMIZERS) + " (default: {image} for images, {text} for text)",
        choices=tuple(OPTIMIZERS),
        listed=False,
        keeps="math",
    )
    momentum: float = setting(0.0, "for sgd and rmsprop", type=float, keeps="math")
    weight_decay: float = setting(
        per_model(image=0.0, text=0.1),
        "the optimizer's weight_decay, adamw's "
        "decoupled; text runs decay the matrices and embeddings only, as nanoGPT "
        "(default: {image:g} for images, {text} for text)",
        type=float,
        keeps="math",
    )
    beta2: float = setting(
        per_model(image=0.999, text=0.99),
        "adam/adamw's second-moment decay (default: {image} for images, {text} for text)",
        type=float,
        keeps="math",
    )
    schedule: str = setting(
        per_model(image="constant", text="warmup-cosine"),
        "learning rate per step: {image} (the images' default); cosine (annealed to 0); onecycle (warm-up to --lr, "
        "then annealed); {text} (text's default, nanoGPT's: linear warm-up for --warmup-iters, then cosine to "
        "--min-lr at --lr-decay-iters); or, with --pipeline-parallel, the pipeline's schedule: gpipe, 1f1b (its "
        "default), zb-h1 (zero bubble: weight gradients fill the bubbles), interleaved-1f1b (--virtual-stages V "
        "stages a rank) or zb-v (two stages a rank in a V, zero bubble); give it twice for both",
        choices=SCHEDULES,
        keeps="math",
    )
    clip_grad: float | None = setting(
        per_model(text=1.0),
        "clip the total gradient norm to MAX_NORM (default: no clipping for images, {text} for text)",
        type=float,
        metavar="MAX_NORM",
        keeps="math",
    )
    min_lr: float = setting(
        1e-4, "warmup-cosine: the learning rate it decays to", type=float, group="text", keeps="math", applies=("text",)
    )
    warmup_iters: int = setting(
        100,
        "warmup-cosine: iterations of linear warm-up",
        type=int,
        low=0,
        group="text",
        keeps="math",
        applies=("text",),
    )
    lr_decay_iters: int = setting(
        2000,
        "warmup-cosine: the iteration at which the rate reaches --min-lr",
        type=int,
        low=1,
        group="text",
        keeps="math",
        applies=("text",),
    )
    # not a flag: the language models decay their matrices and embeddings only, as nanoGPT (set by TrainConfig)
    matrices_only: bool = False

    def __post_init__(self):
        if isinstance(self.optimizer, str):
            object.__setattr__(self, "optimizer", self.optimizer.lower())
        check_part(self)
        for name in ("lr", "momentum", "weight_decay", "clip_grad", "min_lr"):
            value = getattr(self, name)
            if value is None:
                continue
            if not (is_a(value, (int, float)) and math.isfinite(value) and value >= 0) or (
                name == "clip_grad" and value == 0
            ):
                need = "a positive number" if name == "clip_grad" else "a finite number >= 0"
                raise UsageError(f"{flag(name)} {value} is out of range (need {need})")
        _check_fraction("beta2", self.beta2)
        if self.momentum and self.optimizer not in ("sgd", "rmsprop"):
            raise UsageError(f"--momentum applies to sgd and rmsprop, not {self.optimizer}")

    def largest(self) -> tuple[str, float]:
        """(flag, value) of the largest of the rates and bounds the optimizer computes with."""
        values = {flag(n): getattr(self, n) for n in ("lr", "momentum", "weight_decay", "clip_grad", "min_lr")}
        return max(((k, v) for k, v in values.items() if v is not None), key=lambda kv: kv[1])


def _threads_help() -> str:
    return (
        f"CPU threads for torch's operations (default: the cores the load average leaves free, at most one per "
        f"core ({torch.get_num_threads()} here), or $OMP_NUM_THREADS, which torchrun sets to 1; the start-up "
        f"line says what was chosen and why); give it for a float32 run that repeats bit for bit"
    )


@dataclass(frozen=True)
class RunConfig:
    """The run itself: which implementations, how long, its seed, device and precision, the compiled or captured
    step, what it records and where, and resuming."""

    impl: str = setting(
        "both",
        "manual: hand-written model; engine: the autodiff engine's Net (MLP only); torch: the "
        "nn.Module twin; both: manual and torch; all: all three",
        choices=(*IMPLS, *IMPL_GROUPS),
        keeps="math",
    )
    epochs: int = setting(10, "image runs: passes over the training split", type=int, low=1, applies=("image",))
    seed: int = setting(
        0, "initial weights, validation split, batch order, dropout and augmentation", type=int, keeps="math"
    )
    device: str = setting("auto", "cpu, cuda, cuda:N or auto", local=True)
    threads: int | None = setting(None, _threads_help, type=int, low=1, metavar="N")
    dtype: str = setting(
        "float32",
        "bfloat16, float16: mixed precision (float32 data and master weights the "
        "optimizer updates, matrix products in the half dtype, softmax/cross-entropy and batch norm "
        "statistics in float32; float16 with a dynamic loss scale; the twin under torch.autocast; "
        "not --impl engine)",
        choices=DTYPES,
        keeps="math",
    )
    log_interval: int = setting(
        50,
        "steps between logged metrics and --monitor records (each epoch's last step and, "
        "with --monitor, the run's first are recorded too)",
        type=int,
        low=1,
        keeps="record",
    )
    val_interval: int = setting(1, "epochs between validations", type=int, low=1, keeps="record", applies=("image",))
    max_iters: int = setting(2000, "training iterations", type=int, low=1, group="text", applies=("text",))
    eval_interval: int = setting(
        250,
        "iterations between evaluations of the train and val loss (and checkpoints)",
        type=int,
        low=1,
        group="text",
        keeps="math",
        applies=("text",),
    )
    eval_iters: int | str = setting(
        20,
        "batches per split and evaluation, or all: every non-overlapping window of the split",
        type=(int, str),
        parse=parse_eval_iters,
        group="text",
        keeps="math",
        applies=("text",),
    )
    cuda_graph: bool | None = setting(
        None,
        "capture the hand-written step once as a CUDA graph and replay it "
        "(default: on with a CUDA device for the MLP without --monitor or torchrun; on "
        "the CPU the same capturable, in-place step runs eagerly)",
        type=bool,
        form="either",
    )
    compile: str | None = setting(
        None,
        "compile the hand-written step with torch.compile as one graph (fullgraph), "
        "and the twin's model as PyTorch users do (torch.compile(model)); the compile time "
        "is reported apart from the time per epoch or iteration. --compile fast: the "
        "hand-written step's guards are not evaluated at calls whose entry state they "
        "already passed (training/compiled_fast.py)",
        choices=("graph", "fast"),
        form="optional",
        const="graph",
        metavar="fast",
    )
    monitor: bool = setting(
        False,
        "record gradient, weight, update and activation statistics of every "
        "implementation every --log-interval steps, at the run's first step and at each epoch's "
        "last (monitor_<impl>.jsonl and monitor_*.png in the output folder)",
        type=bool,
        form="switch",
        keeps="record",
    )
    tensorboard: Path | None = setting(
        None,
        "also write the losses (and with --monitor the statistics and histograms) as TensorBoard event files into DIR",
        type=Path,
        metavar="DIR",
        local=True,
    )
    plots: bool = setting(True, "skip rendering the PNG figures", type=bool, form="negated", local=True)
    dist_timeout: float = setting(
        120.0, "under torchrun: seconds a collective may wait before the run fails", type=float
    )
    out: Path | None = setting(
        None, "output folder (default: runs/<timestamp>-<pid>, unique to the run)", type=Path, local=True
    )
    overwrite: bool = setting(
        False,
        "replace the run already in --out (without it a fresh run there is refused: --resume continues it)",
        type=bool,
        form="switch",
        local=True,
    )
    resume: Path | None = setting(None, "checkpoint.pt to continue from", type=Path, metavar="PATH", local=True)
    dry_run: bool = setting(
        False, "one batch of each, for a smoke test; no checkpoint is written", type=bool, form="switch"
    )
    quiet: bool = setting(False, "print nothing but errors", type=bool, form="switch", local=True)

    def __post_init__(self):
        if self.compile is True:  # a library caller's compile=True: the one-graph step
            object.__setattr__(self, "compile", "graph")
        elif self.compile is False:
            object.__setattr__(self, "compile", None)
        check_part(self)
        if not (self.eval_iters == "all" or (is_a(self.eval_iters, int) and self.eval_iters >= 1)):
            raise UsageError(f"--eval-iters {self.eval_iters!r} is out of range (an integer >= 1, or all)")
        if not is_a(self.seed, int) or not SEEDS[0] <= self.seed <= SEEDS[1]:
            raise UsageError(f"--seed {self.seed} is out of range (an integer from -2**63 to 2**64 - 1)")
        if not (is_a(self.dist_timeout, (int, float)) and 0 < self.dist_timeout <= MAX_DIST_TIMEOUT):
            raise UsageError(
                f"--dist-timeout {self.dist_timeout} is out of range (need seconds > 0 and at most "
                f"{MAX_DIST_TIMEOUT:g})"
            )
        if self.is_mixed and "engine" in self.impls:
            raise UsageError(
                f"--impl {self.impl}: the autodiff engine has no mixed precision (--dtype {self.dtype}); "
                f"use --impl manual, torch or both, or --dtype float32"
            )

    @property
    def impls(self) -> tuple[str, ...]:
        return IMPL_GROUPS.get(self.impl, (self.impl,))

    @property
    def compile_fast(self) -> bool:
        """--compile fast: the compiled step's guards skipped where proven safe (training/compiled_fast.py)."""
        return self.compile == "fast"

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


@dataclass(frozen=True)
class ParallelConfig:
    """How the GPT is split over the ranks under torchrun (training/parallel/run.py): T x P ranks hold one copy
    of the model, data parallelism over the rest of the world size."""

    tensor_parallel: int = setting(
        1,
        "split each block's heads and MLP width, and the vocabulary, over T ranks (Megatron's f and g by hand)",
        type=int,
        low=1,
        metavar="T",
        group="parallel",
    )
    sequence_parallel: bool = setting(
        False,
        "with --tensor-parallel: layer norms and residuals on each rank's "
        "block_size / T positions (all-gather / reduce-scatter along the sequence)",
        type=bool,
        form="switch",
        group="parallel",
    )
    context_parallel: int = setting(
        1,
        "split each window's positions over C ranks, two zigzag chunks a rank (one early, one late), the "
        "attention a ring passing keys and values round (ring attention by hand)",
        type=int,
        low=1,
        metavar="C",
        group="parallel",
    )
    expert_parallel: int = setting(
        1,
        "with --n-experts: split each block's experts over E ranks, each rank's tokens sent to their experts' "
        "ranks and back (all-to-all by hand); the world size is E, data parallelism over the same ranks",
        type=int,
        low=1,
        metavar="E",
        group="parallel",
    )
    pipeline_parallel: int = setting(
        1,
        "cut the blocks into P stages (P x V with several stages a rank), run by --schedule gpipe, 1f1b, zb-h1, "
        "interleaved-1f1b or zb-v",
        type=int,
        low=1,
        metavar="P",
        group="parallel",
    )
    pipeline_schedule: str = setting(
        "1f1b",
        "the same as --schedule gpipe|1f1b|zb-h1|interleaved-1f1b|zb-v",
        choices=PIPELINE_SCHEDULES,
        shares="schedule",
        group="parallel",
    )
    virtual_stages: int = setting(
        1,
        "--schedule interleaved-1f1b: the stages each rank holds (V >= 2; rank r runs stages r, r + P, ...), "
        "the bubble about V times smaller for V times the messages",
        type=int,
        low=1,
        metavar="V",
        group="parallel",
    )
    micro_batches: int = setting(
        1,
        "a pipelined step's micro-batches (each data-parallel rank's batch splits into M equal parts)",
        type=int,
        low=1,
        metavar="M",
        group="parallel",
    )
    zero: int = setting(
        0,
        "ZeRO over the data-parallel ranks: 0 all-reduce, 1 optimizer state sharded, 2 gradients sharded too",
        type=int,
        choices=(0, 1, 2),
        group="parallel",
    )
    check_parity: bool = setting(
        False,
        "run the first step sharded and in one process (rank 0), print per tensor "
        "the largest difference and whether it is float64 round-off or a bug, and stop",
        type=bool,
        form="switch",
        group="parallel",
    )

    def __post_init__(self):
        for name in (
            "tensor_parallel",
            "context_parallel",
            "expert_parallel",
            "pipeline_parallel",
            "virtual_stages",
            "micro_batches",
        ):
            value = getattr(self, name)
            if not is_a(value, int) or value < 1:
                raise UsageError(f"{flag(name)} {value!r} is out of range (an integer, at least 1)")
        if not is_a(self.zero, int) or self.zero not in (0, 1, 2):
            raise UsageError(
                f"--zero {self.zero!r}: the ZeRO stage is 0 (all-reduce), 1 (optimizer state sharded) "
                f"or 2 (gradients too)"
            )
        if self.pipeline_schedule not in PIPELINE_SCHEDULES:
            raise UsageError(
                f"--schedule {self.pipeline_schedule!r}: unknown pipeline schedule; known: "
                f"{', '.join(PIPELINE_SCHEDULES)}"
            )
        check_part(self)

    @property
    def stages_a_rank(self) -> int:
        """V: the pipeline stages a rank holds (--virtual-stages under interleaved 1F1B, two under ZB-V, else one)."""
        from ..parallel.pipeline_schedules import chunks_per_rank

        return chunks_per_rank(self.pipeline_schedule, self.virtual_stages)

    def split(self) -> dict:
        """The settings that decide each rank's state and the order of every sum: a resume must keep them all."""
        return {k: getattr(self, k) for k in PARALLEL_KEYS if k != "check_parity"}

    def requested(self, given: frozenset) -> bool:
        """Whether the run takes training/parallel/run.py's path: a split asked for, or any of its settings
        given (a checkpoint's split of all defaults too)."""
        return (
            self.tensor_parallel > 1
            or self.context_parallel > 1
            or self.expert_parallel > 1
            or self.pipeline_parallel > 1
            or self.zero > 0
            or self.check_parity
            or self.sequence_parallel
            or any(n in given for n in PARALLEL_KEYS)
        )

    def check_split(self, model: ModelConfig, run: RunConfig, given: frozenset) -> None:
        """The split against the model it splits and the run (the world size is checked when the run starts:
        training/parallel/run.py).  Each refusal names the values."""
        T, P = self.tensor_parallel, self.pipeline_parallel
        if model.name != "gpt":
            raise UsageError(
                f"model parallelism (--tensor-parallel, --context-parallel, --pipeline-parallel, --zero, "
                f"--check-parity) splits the GPT only, not --model {model.name}"
            )
        if self.sequence_parallel and T == 1:
            raise UsageError(
                "--sequence-parallel splits the sequence over the tensor-parallel ranks: give --tensor-parallel T > 1"
            )
        given_pipe = [k for k in ("micro_batches", "pipeline_schedule", "virtual_stages") if k in given]
        if P == 1 and given_pipe:
            what = (
                "--schedule " + self.pipeline_schedule if given_pipe[0] == "pipeline_schedule" else flag(given_pipe[0])
            )
            raise UsageError(f"{what} applies to a pipeline: give --pipeline-parallel P > 1")
        if P > 1:  # the counts the schedule needs (pipeline_schedules.check_schedule names them)
            from ..parallel.pipeline_schedules import check_schedule

            try:
                check_schedule(self.pipeline_schedule, P, self.micro_batches, self.virtual_stages)
            except ValueError as e:
                raise UsageError(str(e)) from None
        # (n_embd is a multiple of n_head already)
        n_layer = cast(int, model.n_layer)  # the GPT's per-model default, filled in by TrainConfig
        for what, n, parts in (("--n-head", model.n_head, T), ("--n-layer", n_layer, P)):
            if n % parts:
                split = "--tensor-parallel" if parts == T else "--pipeline-parallel"
                raise UsageError(f"{what} {n} does not divide by {split} {parts}")
        V = self.stages_a_rank
        if n_layer % (P * V):
            raise UsageError(
                f"--n-layer {n_layer} does not divide by --pipeline-parallel {P} x {V} stages a rank "
                f"(--schedule {self.pipeline_schedule}) = {P * V} stages"
            )
        if self.sequence_parallel and model.block_size % T:
            raise UsageError(
                f"--block-size {model.block_size} does not divide by --tensor-parallel {T} (sequence "
                f"parallelism gives each rank block_size / T positions)"
            )
        C = self.context_parallel
        if C > 1 and P > 1:
            raise UsageError(
                f"--context-parallel {C} with --pipeline-parallel {P} is not supported: context parallelism "
                f"composes with tensor and data parallelism"
            )
        if C > 1 and model.block_size % (2 * C):
            raise UsageError(
                f"--block-size {model.block_size} does not divide by 2 x --context-parallel {C} (each rank holds "
                f"two chunks of every window)"
            )
        if C > 1 and self.sequence_parallel and (model.block_size // C) % T:
            raise UsageError(
                f"--block-size {model.block_size} / --context-parallel {C} = {model.block_size // C} positions a "
                f"rank do not divide by --tensor-parallel {T} (--sequence-parallel splits them further)"
            )
        E = self.expert_parallel
        if E > 1 and not model.n_experts:
            raise UsageError(
                f"--expert-parallel {E} splits a mixture of experts: give --n-experts K (a multiple of {E})"
            )
        if E > 1 and model.n_experts % E:
            raise UsageError(f"--n-experts {model.n_experts} does not divide by --expert-parallel {E}")
        if model.n_experts and (T > 1 or C > 1 or P > 1 or self.zero):
            raise UsageError(
                f"--n-experts {model.n_experts} with --tensor-parallel {T} --context-parallel {C} "
                f"--pipeline-parallel {P} --zero {self.zero} is not supported: a mixture of experts splits with "
                f"--expert-parallel E alone (data parallelism over the same ranks)"
            )
        if model.dropout:
            raise UsageError(
                f"--dropout {model.dropout}: model parallelism runs without dropout (its masks would "
                f"have to be drawn for the whole model on every rank); use --dropout 0"
            )
        if run.impl != "manual":
            raise UsageError(
                f"--impl {run.impl}: model parallelism trains the hand-written GPT (--impl manual); its "
                f"twins are training/parallel/verify/*_twin.py, tested against it"
            )
        for name, bad in (
            ("dtype", run.is_mixed),
            ("compile", bool(run.compile)),
            ("cuda_graph", bool(run.cuda_graph)),
            ("monitor", run.monitor),
        ):
            if bad:
                value = f" {run.dtype}" if name == "dtype" else ""
                raise UsageError(
                    f"{flag(name)}{value} with model parallelism is not supported (float32 or "
                    f"float64, eager, no monitor)"
                )
        if self.check_parity and run.resume is not None:
            raise UsageError(
                f"--check-parity with --resume {run.resume}: the check takes a fresh run's first step; drop --resume"
            )


PARALLEL_KEYS = tuple(f for f in ParallelConfig.__dataclass_fields__)
