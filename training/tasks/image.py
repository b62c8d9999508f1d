"""ImageTask: MNIST / Fashion-MNIST classification for the trainer (training/tasks/task.py).

A round is an epoch over the training split in a seeded permutation; the round's record holds the training loss
and accuracy and, every ``--val-interval`` epochs and at the last, the validation split's; the results are the
test split's loss and accuracy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

import torch

from ..compiled import compile_note
from ..config.data import DataConfig
from ..config.model import ModelConfig
from ..config.run import RunConfig
from ..errors import UsageError
from ..impls import Impl
from ..impls.models import SAMPLE_SHAPES, build_models
from ..loop import evaluate, train_epoch
from ..parallel.distributed import DistInfo
from .image_data import check_data_dir, load_data


class ImageTask:
    kind = "image"
    watch_activations = True

    @staticmethod
    def check_source(data: DataConfig) -> None:
        check_data_dir(data.data_dir)

    def __init__(
        self, model: ModelConfig, data: DataConfig, run: RunConfig, device: torch.device, say: Callable
    ) -> None:
        self.model, self.batches, self.run, self.device = model, data, run, device
        t0 = time.perf_counter()
        self.data = load_data(data, device, run.torch_dtype, say, sample_shape=SAMPLE_SHAPES[model.name], seed=run.seed)
        self.data_seconds = time.perf_counter() - t0
        self.fingerprint, self.data_name = self.data.fingerprint, f"--data-dir {data.data_dir}"
        n = self.data.train_x.shape[0]
        self.rounds = run.epochs
        self.steps_per_round = -(-n // data.batch_size)
        self.total_steps = self.rounds * self.steps_per_round
        self.round_ends = {epoch * self.steps_per_round for epoch in range(1, run.epochs + 1)}

    def describe(self, device: torch.device) -> str:
        d = self.data
        n_val = 0 if d.val_x is None else d.val_x.shape[0]
        return f"{self.batches.dataset}: {d.train_x.shape[0]} train, {n_val} val, {d.test_x.shape[0]} test on {device}"

    def check(self, info: DistInfo) -> None:
        """Every global batch must give every rank at least one sample."""
        bs, n = self.batches.batch_size, self.data.train_x.shape[0]
        smallest = min(bs, n % bs or bs)
        if info.enabled and smallest < info.world_size:
            raise UsageError(
                f"--batch-size {bs} over {n} samples leaves a batch of {smallest}, fewer "
                f"than the {info.world_size} processes; pick a batch size (or --limit-train) so every "
                f"batch has at least {info.world_size} samples"
            )

    def build_models(self, device: torch.device, dtype: torch.dtype, info: DistInfo) -> dict:
        return build_models(self.model, self.run, device, dtype, sync_bn=info.enabled and self.model.sync_bn)

    def round_order(self, r: int, gen: torch.Generator):
        return torch.randperm(self.data.train_x.shape[0], generator=gen).to(self.device)

    def train_round(self, impl: Impl, order, r: int, log: Callable, info: DistInfo, after_step) -> dict:
        return train_epoch(impl, self.data, order, r, self.batches, self.run, log, info, after_step)

    def evaluate_round(self, impl: Impl, r: int, info: DistInfo) -> dict:
        d, run = self.data, self.run
        if d.val_x is None or not (r % run.val_interval == 0 or r == run.epochs):
            return {"val_loss": None, "val_acc": None}
        val_loss, val_acc = evaluate(impl, d.val_x, cast(torch.Tensor, d.val_y), info=info)  # held out with val_x
        return {"val_loss": val_loss, "val_acc": val_acc}

    def round_line(self, r: int, name: str, rec: dict) -> str:
        val = "" if rec["val_loss"] is None else f" | val loss {rec['val_loss']:.4f} acc {rec['val_acc']:.2%}"
        return (
            f"epoch {r:>3} {name:<6} train loss {rec['train_loss']:.4f} acc {rec['train_acc']:.2%}{val} | "
            f"{rec['seconds']:.2f} s{compile_note(rec)}"
        )

    def checkpoint_extra(self) -> dict:
        return {}

    def round_name(self, r: int, pad: bool = False) -> str:
        return f"epoch {r:>3}" if pad else f"epoch {r}"

    def size_flags(self) -> str:
        m = self.model
        return f"--hidden {m.hidden} --depth {m.depth}" if m.name == "mlp" else "--model cnn"

    def extent(self, records: list[dict]) -> dict:
        return {"epochs": max(r["epoch"] for r in records if r["type"] == "epoch")}

    def extent_words(self, summary: dict) -> str:
        n = summary["epochs"]
        return f"{n} epoch{'' if n == 1 else 's'}"

    def results(self, impl: Impl, rows: list[dict], info: DistInfo) -> dict:
        test_loss, test_acc = evaluate(impl, self.data.test_x, self.data.test_y, info=info)
        return {
            "test_accuracy": test_acc,
            "test_loss": test_loss,
            "train_loss": rows[-1]["train_loss"],
            "seconds_per_epoch": sum(h["seconds"] for h in rows) / len(rows),
        }

    def results_table(self, results: dict) -> list[str]:
        lines = [f"\n{'impl':<8}{'test acc':>10}{'test loss':>11}{'train loss':>12}{'s/epoch':>10}"]
        for name, r in results.items():
            lines.append(
                f"{name:<8}{r['test_accuracy']:>10.2%}{r['test_loss']:>11.4f}{r['train_loss']:>12.4f}"
                f"{r['seconds_per_epoch']:>10.2f}"
            )
        return lines
