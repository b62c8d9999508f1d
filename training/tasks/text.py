"""TextTask: character-level language modelling for the trainer (training/tasks/task.py), nanoGPT's way.

A round is ``--eval-interval`` iterations (the last one may be shorter, ending at ``--max-iters``); each
iteration trains on ``--batch-size`` windows of ``--block-size`` characters at random offsets of the training
split, drawn once per round for every implementation.  After each round the train and val loss are estimated on
``--eval-iters`` batches per split (drawn from a stream of their own, the same for every implementation and on
resume), or on every non-overlapping window (``--eval-iters all``).  The loss is the mean cross-entropy per
character, in nats.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import cast

import torch

from ..compiled import compile_note, compile_seconds, round_seconds
from ..config.data import DataConfig
from ..config.model import ModelConfig
from ..config.run import RunConfig
from ..errors import UsageError
from ..impls import Impl
from ..impls.models import use_generator
from ..loop import StepSums, epoch_generator, set_training
from ..parallel.distributed import DistInfo, shard_bounds
from .corpus import TextData, corpus_path, load_text
from .text_models import build_text_models

EVAL_WINDOWS = 256  # windows per forward when evaluating every window of a split


class TextTask:
    kind = "text"
    watch_activations = False  # the language models are not Sequential trees: no layer hooks

    @staticmethod
    def check_source(data: DataConfig) -> None:
        """Nothing to check before reading: the corpus is read (and refused if unusable) when the task is made,
        still before the output folder is created."""

    def __init__(
        self, model: ModelConfig, data: DataConfig, run: RunConfig, device: torch.device, say: Callable
    ) -> None:
        self.model, self.batches, self.run, self.device = model, data, run, device
        t0 = time.perf_counter()
        self.text: TextData = load_text(corpus_path(data.dataset, data.data_file), model.block_size, device)
        self.data_seconds = time.perf_counter() - t0
        self.fingerprint = self.text.fingerprint
        self.data_name = f"--data-file {data.data_file}" if data.data_file else f"--dataset {data.dataset}"
        self.rounds = -(-run.max_iters // run.eval_interval)
        self.steps_per_round = run.eval_interval
        self.total_steps = run.max_iters
        self.round_ends = {self.last_iter(r) for r in range(1, self.rounds + 1)}

    def last_iter(self, r: int) -> int:
        """The iteration that ends round ``r`` (iterations count from 1)."""
        return min(r * self.run.eval_interval, self.run.max_iters)

    def describe(self, device: torch.device) -> str:
        t = self.text
        name = self.batches.data_file or self.batches.dataset
        return (
            f"{name}: {t.train.shape[0]:,} train, {t.val.shape[0]:,} val characters, a vocabulary of "
            f"{t.vocab_size}, on {device}"
        )

    def check(self, info: DistInfo) -> None:
        """Under torchrun each rank trains on its contiguous share of every batch's windows: each needs one, and
        dropout is refused (its masks are drawn per window of the rank's share, not of the global batch, so the
        run would differ from one process's)."""
        if not info.enabled:
            return
        if self.batches.batch_size < info.world_size:
            raise UsageError(
                f"--batch-size {self.batches.batch_size} windows cannot be shared by {info.world_size} "
                f"processes; use --batch-size >= {info.world_size}"
            )
        if self.model.n_experts:
            raise UsageError(
                f"--n-experts {self.model.n_experts} under torchrun without --expert-parallel: each process "
                f"would route and cap its own share of the batch, not the global batch as one process does"
            )
        if self.model.dropout:
            raise UsageError(
                f"--dropout {self.model.dropout} under torchrun: the language models' dropout masks are "
                f"drawn for each process's share of the batch, not for the global batch, so the run "
                f"would not equal one process's; use --dropout 0 with torchrun, or one process"
            )

    def build_models(self, device: torch.device, dtype: torch.dtype, info: DistInfo) -> dict:
        return build_text_models(self.model, self.run, self.text.vocab_size, device, dtype)

    def round_order(self, r: int, gen: torch.Generator):
        """The offsets of round ``r``'s windows, (iterations, batch), drawn on the CPU from ``gen``."""
        steps = self.last_iter(r) - (r - 1) * self.run.eval_interval
        if self.run.dry_run:
            steps = 1
        high = self.text.train.shape[0] - self.model.block_size
        return torch.randint(high, (steps, self.batches.batch_size), generator=gen).to(self.device)

    def train_round(self, impl: Impl, order, r: int, log: Callable, info: DistInfo, after_step) -> dict:
        from tqdm import tqdm

        run, T, B = self.run, self.model.block_size, self.batches.batch_size
        first = (r - 1) * run.eval_interval  # iterations before this round
        steps = order.shape[0]
        data = getattr(impl, "data_info", info)  # a model-parallel run splits the batch over its data-parallel ranks
        lo, hi = shard_bounds(B, data) if data.enabled else (0, B)
        sums = StepSums(run.log_interval, 1, order.device, info)  # per step: the summed loss
        loss_sum, seen = 0.0, 0
        bar = tqdm(
            total=steps,
            desc=f"iter {first + 1}-{first + steps} {impl.name}",
            leave=False,
            file=sys.stdout,
            disable=run.quiet or not info.is_main or not sys.stdout.isatty(),
        )
        set_training(impl.model, True)
        use_generator(impl.model, epoch_generator(run.seed, r, order.device))  # the round's dropout masks
        start, compiling = time.perf_counter(), compile_seconds(impl)
        tokens = B * T  # of the global batch: the gradient is that of their mean loss
        for s in range(steps):
            it = first + s + 1
            x, y = TextData.windows_at(self.text.train, order[s, lo:hi], T)  # (B, T) each: this rank's windows
            batch_loss, logits, _ = impl.train_step(x, y, tokens, it)
            if impl.sched is not None:
                impl.sched.step()
            if after_step is not None:
                after_step(impl, it, logits)
            sums.add(batch_loss.detach())
            if sums.due(s == steps - 1):
                start_it = it - sums.kept + 1
                values = [v[0] for v in sums.take(impl.name, lambda i, start_it=start_it: f"iteration {start_it + i}")]
                loss_sum += sum(values)
                seen += len(values) * tokens
                log(
                    {
                        "type": "step",
                        "impl": impl.name,
                        "epoch": r,
                        "step": s + 1,
                        "global_step": it,
                        "loss": values[-1] / tokens,
                        "train_loss": loss_sum / seen,
                    }
                )
                bar.set_postfix(loss=f"{loss_sum / seen:.4f}")
            bar.update(1)
        seconds, compiling = round_seconds(impl, order.device, start, compiling)  # --compile: compiling apart
        bar.close()
        return {"iter": first + steps, "steps_loss": loss_sum / seen, "seconds": seconds, "compile_seconds": compiling}

    def evaluate_round(self, impl: Impl, r: int, info: DistInfo) -> dict:
        """The mean loss per character on each split: ``--eval-iters`` batches at offsets drawn from a stream seeded
        by the seed and the round (every implementation sees the same), or every window.  Under torchrun every rank
        evaluates the whole of it (the same weights: the same numbers, and no collective)."""
        gen = torch.Generator().manual_seed((self.run.seed * 1_000_003 + 7_919 * r + 1) % 2**64)
        out = {}
        was = set_training(impl.model, False)
        try:
            for split in ("train", "val"):
                out[f"{split}_loss"] = self._loss(impl, split, gen)
        finally:
            set_training(impl.model, was)
        return out

    def _loss(self, impl: Impl, split: str, gen: torch.Generator) -> float:
        iters, T = self.run.eval_iters, self.model.block_size
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        count = 0
        if iters == "all":
            xs, ys = self.text.all_windows(split, T)
            batches = (
                (xs[i : i + EVAL_WINDOWS], ys[i : i + EVAL_WINDOWS]) for i in range(0, xs.shape[0], EVAL_WINDOWS)
            )
        else:
            n = cast(int, iters)  # not "all": a count
            batches = (self.text.batch(split, self.batches.batch_size, T, gen) for _ in range(n))
        for x, y in batches:
            loss, _ = impl.eval_batch(x, y)
            total += loss.double()
            count += y.numel()
        return total.item() / count

    def round_line(self, r: int, name: str, rec: dict) -> str:
        return (
            f"iter {rec['iter']:>5} {name:<6} train loss {rec['train_loss']:.4f} | val loss {rec['val_loss']:.4f} "
            f"| {rec['seconds']:.2f} s{compile_note(rec)}"
        )

    def checkpoint_extra(self) -> dict:
        return {"vocab": self.text.vocab}

    def round_name(self, r: int, pad: bool = False) -> str:
        return f"iter {self.last_iter(r):>5}" if pad else f"iteration {self.last_iter(r)}"

    def size_flags(self) -> str:
        c = self.model
        if c.name == "gpt":
            return f"--n-layer {c.n_layer} --n-head {c.n_head} --n-embd {c.n_embd} --block-size {c.block_size}"
        return f"--n-layer {c.n_layer} --hidden {c.hidden} --n-embd {c.n_embd}"

    def extent(self, records: list[dict]) -> dict:
        return {
            "iters": max(r["iter"] for r in records if r["type"] == "epoch"),
            "vocab_size": self.text.vocab_size,
            "corpus": self.text.source,
        }

    def extent_words(self, summary: dict) -> str:
        return f"{summary['iters']} iterations"

    def results(self, impl: Impl, rows: list[dict], info: DistInfo) -> dict:
        iters = rows[-1]["iter"]
        return {
            "train_loss": rows[-1]["train_loss"],
            "val_loss": rows[-1]["val_loss"],
            "iters": iters,
            "seconds_per_iter": sum(h["seconds"] for h in rows) / max(iters, 1),
        }

    def results_table(self, results: dict) -> list[str]:
        lines = [f"\n{'impl':<8}{'val loss':>10}{'train loss':>12}{'ms/iter':>10}"]
        for name, r in results.items():
            lines.append(f"{name:<8}{r['val_loss']:>10.4f}{r['train_loss']:>12.4f}{r['seconds_per_iter'] * 1e3:>10.1f}")
        return lines
