"""The seam between the trainer and what it trains on: a ``Task``.

The trainer (training/trainer.py) runs any task the same way: it builds the implementations from the task's
models, then for each round trains every implementation on the same batches (``train_round``), evaluates it,
logs, measures how far the implementations drifted apart and writes a checkpoint; at the end it asks the task for
the results and figures.  Two tasks implement it:

- ``ImageTask`` (training/tasks/image.py): MNIST / Fashion-MNIST classification; a round is an epoch, measured
  by loss and accuracy on the validation and test splits.
- ``TextTask`` (training/tasks/text.py): character-level language modelling; a round is ``--eval-interval``
  iterations, measured by the train and validation loss.

Records (metrics.jsonl) and checkpoints call a round an "epoch" for both (the checkpoint's ``epoch`` is the number
of complete rounds): the loop, the checkpoint's checks and the drift records do not need to know which task ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from ..config.data import DataConfig
from ..config.model import ModelConfig
from ..config.run import RunConfig
from ..impls import Impl
from ..parallel.distributed import DistInfo

if TYPE_CHECKING:  # imported on demand at run time (task_class)
    from .image import ImageTask
    from .text import TextTask


class Task(Protocol):
    kind: str  # "image" or "text"
    fingerprint: dict  # of the data (training/storage/fingerprint.py): a resume on other data is refused
    rounds: int  # rounds in the run: epochs, or evaluation intervals
    steps_per_round: int  # training steps in a full round (the drift's probes)
    total_steps: int  # training steps in the whole run (the learning-rate schedule's length)
    round_ends: set[int]  # the global step numbers that end a round (the monitor records them)

    watch_activations: bool  # --monitor records per-layer activation statistics (the models are Sequential trees)
    data_seconds: float  # how long loading the data took
    data_name: str  # where the data came from, as the user gave it (--data-dir, --data-file)

    @staticmethod
    def check_source(data: DataConfig) -> None:
        """Refuse (UsageError) data that cannot be there, cheaply, before the output folder is touched."""

    def describe(self, device: torch.device) -> str:
        """The start of the run's first line: what the data is."""

    def check(self, info: DistInfo) -> None:
        """Refuse (UsageError) what this data cannot do with these settings under data parallelism over
        ``info``'s ranks, before anything is built."""

    def build_models(self, device: torch.device, dtype: torch.dtype, info: DistInfo) -> dict:
        """impl name -> model, all with the same initial weights."""

    def round_order(self, r: int, gen: torch.Generator):
        """Round ``r``'s batches, drawn once from ``gen`` (the checkpointed batch stream) for every implementation."""

    def train_round(
        self, impl: Impl, order, r: int, log: Callable[[dict], None], info: DistInfo, after_step: Callable | None
    ) -> dict:
        """Train ``impl`` through round ``r``; -> the round record's metrics (at least train_loss, seconds)."""

    def evaluate_round(self, impl: Impl, r: int, info: DistInfo) -> dict:
        """The evaluation after round ``r``'s training: keys added to the round record."""

    def round_line(self, r: int, name: str, rec: dict) -> str:
        """What the run prints for a round record."""

    def checkpoint_extra(self) -> dict:
        """What else the checkpoint keeps for using the model later (a text run: its vocabulary, for sample.py)."""

    def round_name(self, r: int, pad: bool = False) -> str:
        """Round ``r`` in words: "epoch 3", or "iteration 750" (its last); ``pad``: aligned for a column."""

    def size_flags(self) -> str:
        """The flags that set the models' size, for a model that does not fit in memory."""

    def extent(self, records: list[dict]) -> dict:
        """How far the run went, for summary.json: {"epochs": n} or {"iters": n}."""

    def extent_words(self, summary: dict) -> str:
        """The same in words: "10 epochs", "2000 iterations"."""

    def results(self, impl: Impl, rows: list[dict], info: DistInfo) -> dict:
        """The final figures of one implementation for summary.json (``rows``: its round records)."""

    def results_table(self, results: dict) -> list[str]:
        """The final table the run prints."""


def task_class(family: str) -> type[ImageTask] | type[TextTask]:
    """The task of a model ``family``, "image" or "text" (imported on demand: each pulls in its own data and
    models)."""
    if family == "text":
        from .text import TextTask

        return TextTask
    from .image import ImageTask

    return ImageTask


def make_task(
    family: str, model: ModelConfig, data: DataConfig, run: RunConfig, device: torch.device, say: Callable
) -> Task:
    """The task of ``family`` for this model, data and run, its data loaded onto ``device``."""
    return task_class(family)(model, data, run, device, say)
