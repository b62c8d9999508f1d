"""run(config): a whole training run — data, models, epochs, checkpoints, evaluation, summary and figures.

Outputs go to config.out: metrics.jsonl (every logged record), checkpoint.pt (atomically, after every epoch),
summary.json and PNG figures at the end.  A run resumed from its checkpoint writes the same files as one that
was never interrupted; a checkpoint that already holds every epoch only completes the outputs.  The folder is
locked for the whole run and created only once the run starts (training/output.py); a full disk stops the run
with one line, the last complete checkpoint kept.
"""
from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from .agreement import check_ranks_agree, run_identity
from .checkpoint import check_data, checkpoint_state, load_checkpoint, restore, save_checkpoint
from .config import TrainConfig, resolve_device, use_threads
from .data import check_data_dir, load_data
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, NonFiniteLoss, RunFailed, UsageError
from .files import WriteFailed, atomic_write_text
from .drift import Drift, first_step_agreement
from .impls import build_impls, check_mixed_precision, max_param_abs_diff
from .distributed import DistInfo
from .loop import evaluate, train_epoch
from .monitors import (attach_monitors, close_tensorboard, log_scalars, monitor_state, open_tensorboard,
                       restore_monitors, write_monitor_outputs)
from .models import SAMPLE_SHAPES
from .output import OutputFolder
from .parallel import under_torchrun


def run(config: TrainConfig, say: Callable | None = None, *, init_method: str | None = None,
        info: DistInfo | None = None) -> int:
    """Train as ``config`` says; return the exit status (0, or 1 for a non-finite loss, 130 for Ctrl-C).

    Raises UsageError for bad settings, missing or other data, a damaged checkpoint or an unusable or busy output
    folder, before anything is trained; RunFailed when the run cannot go on (a write fails, another rank failed).
    Under torchrun (or with ``info``/``init_method`` given, as tests do) every rank runs this; rank 0 alone prints
    and writes files.
    """
    use_threads(config.threads)
    device = resolve_device(config.device)
    with under_torchrun(device, config.dist_timeout, init_method, info) as (info, device):
        quiet = config.quiet or not info.is_main
        return _run(config, device, info, say or ((lambda *a, **k: None) if quiet else print))


def _check_batches(config: TrainConfig, n: int, info: DistInfo) -> None:
    """Every global batch must give every rank at least one sample."""
    smallest = min(config.batch_size, n % config.batch_size or config.batch_size)
    if info.enabled and smallest < info.world_size:
        raise UsageError(f"--batch-size {config.batch_size} over {n} samples leaves a batch of {smallest}, fewer "
                         f"than the {info.world_size} processes; pick a batch size (or --limit-train) so every "
                         f"batch has at least {info.world_size} samples")


def _run(config: TrainConfig, device: torch.device, info: DistInfo, say: Callable) -> int:
    ckpt = None
    if config.resume is not None:
        config, ckpt = load_checkpoint(config.resume, config)
        saved_world = ckpt.get("world_size", 1)
        if saved_world != info.world_size:
            say(f"note: the checkpoint was trained on {saved_world} process(es), this run has {info.world_size}; "
                f"the global batch is the same, so it continues the same run (sums are taken in another order)")
    check_mixed_precision(config, info)
    out = config.out or (config.resume.parent if config.resume else Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    check_data_dir(config.data_dir)
    folder = OutputFolder(out, config.resume, config.overwrite) if info.is_main else None
    try:  # rank 0 holds the output folder's lock from here to the end of the run
        if folder is not None:
            folder.check()
        return _train(config, device, info, say, ckpt, out, folder)
    finally:
        if folder is not None:
            folder.release()


def _build(config: TrainConfig, device: torch.device, info: DistInfo, steps_per_epoch: int) -> dict:
    """build_impls, with a model too large for the device's memory as one line naming its size settings."""
    try:
        return build_impls(config, device, config.torch_dtype, info, steps_per_epoch=steps_per_epoch)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:
        text = str(e)
        if not isinstance(e, (torch.OutOfMemoryError, MemoryError)) and "allocate" not in text:
            raise
        size = re.search(r"allocate (\d+) bytes", text)
        tried = f"{int(size.group(1)) / 1e9:.1f} GB at once" if size else text.strip().splitlines()[0][:120]
        shape = f"--hidden {config.hidden} --depth {config.depth}" if config.model == "mlp" else "--model cnn"
        raise UsageError(f"{shape}: the models do not fit in the memory of {device} (torch could not allocate "
                         f"{tried}); use a smaller model") from None


def _train(config: TrainConfig, device: torch.device, info: DistInfo, say: Callable, ckpt: dict | None, out: Path,
           folder: OutputFolder | None) -> int:
    t0 = time.perf_counter()
    data = load_data(config, device, config.torch_dtype, say, sample_shape=SAMPLE_SHAPES[config.model])
    data_seconds = time.perf_counter() - t0
    if ckpt is not None:
        check_data(ckpt, data.fingerprint, config.resume, config.data_dir)
    check_ranks_agree(info, run_identity(config, device, data.fingerprint, ckpt))
    _check_batches(config, data.train_x.shape[0], info)
    steps_per_epoch = -(-data.train_x.shape[0] // config.batch_size)
    impls = _build(config, device, info, steps_per_epoch)
    writer = open_tensorboard(config, info)
    monitors = attach_monitors(impls, config, info, steps_per_epoch, writer)
    batch_gen = torch.Generator().manual_seed((config.seed + 1) % 2 ** 64)  # torch's range
    records: list[dict] = []  # everything logged, in order; epochs are the records of type "epoch"
    start_epoch = 1
    if ckpt is not None:
        restore(impls, ckpt, batch_gen, device, steps_per_epoch, config.resume)
        records = list(ckpt["records"])
        restore_monitors(monitors, ckpt)
        start_epoch = ckpt["epoch"] + 1
        say(f"resuming from {config.resume} after epoch {ckpt['epoch']}")
    ckpt_path = out / "checkpoint.pt"
    saved_epoch = None if ckpt is None or ckpt_path.resolve() != config.resume.resolve() else ckpt["epoch"]
    metrics_file = None
    if folder is not None:  # the run is sure to start: its folder is made (and claimed) now
        folder.create(say)
        metrics_path = out / "metrics.jsonl"
        # Rewrite the log from what the checkpoint vouches for, so a half-finished epoch leaves no stray lines.
        atomic_write_text(metrics_path, "".join(json.dumps(r) + "\n" for r in records))
        metrics_file = open(metrics_path, "a")

    def log(rec: dict) -> None:
        if metrics_file is not None:
            try:
                metrics_file.write(json.dumps(rec) + "\n")
                metrics_file.flush()
            except OSError as e:
                raise WriteFailed(metrics_path, e, "its complete lines are kept (--resume rewrites it)") from e
        log_scalars(writer, rec)
        records.append(rec)

    n_val = 0 if data.val_x is None else data.val_x.shape[0]
    say(f"{config.dataset}: {data.train_x.shape[0]} train, {n_val} val, {data.test_x.shape[0]} test on {device} "
        f"({_precision(config)}; {_count(torch.get_num_threads(), 'CPU thread')}); loaded in {data_seconds:.2f} s; "
        f"model {config.model}; impl {', '.join(impls)}; "
        f"{f'{info.world_size} processes; ' if info.enabled else ''}output {out}")
    drift = Drift(impls, steps_per_epoch, log) if len(impls) > 1 else None
    try:
        for epoch in range(start_epoch, config.epochs + 1):
            perm = torch.randperm(data.train_x.shape[0], generator=batch_gen).to(device)
            for name, impl in impls.items():
                rec = {"type": "epoch", "impl": name, "epoch": epoch,
                       **train_epoch(impl, data, perm, epoch, config, log, info,
                                     drift.after_step if drift is not None else None)}
                rec["val_loss"] = rec["val_acc"] = None
                if data.val_x is not None and (epoch % config.val_interval == 0 or epoch == config.epochs):
                    rec["val_loss"], rec["val_acc"] = evaluate(impl, data.val_x, data.val_y, info=info)
                log(rec)
                val = "" if rec["val_loss"] is None else f" | val loss {rec['val_loss']:.4f} acc {rec['val_acc']:.2%}"
                say(f"epoch {epoch:>3} {name:<6} train loss {rec['train_loss']:.4f} acc {rec['train_acc']:.2%}"
                    f"{val} | {rec['seconds']:.2f} s")
            if drift is not None:
                diff = drift.end_epoch(epoch)
                say(f"epoch {epoch:>3} largest weight difference between {', '.join(impls)}: {diff:.3e}"
                    f"{_MIXED_DRIFT if config.is_mixed else ''}")
            if info.is_main:
                save_checkpoint(ckpt_path, {**checkpoint_state(impls, config, epoch, records, batch_gen,
                                                               data.fingerprint),
                                            "world_size": info.world_size, "monitor": monitor_state(monitors)})
                saved_epoch = epoch
            if config.dry_run:
                break
        _finish(config, out, impls, data, records, say, info, monitors)
    except NonFiniteLoss as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"\ninterrupted; {_last_checkpoint(ckpt_path, saved_epoch)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except WriteFailed as e:
        raise RunFailed(f"{e}; {_last_checkpoint(ckpt_path, saved_epoch)}") from None
    finally:
        if metrics_file is not None:
            with contextlib.suppress(OSError):  # every line was flushed; after a failed write, nothing more to say
                metrics_file.close()
        close_tensorboard(writer)
    return EXIT_OK


def _last_checkpoint(path: Path, epoch: int | None) -> str:
    if epoch is None:
        return "no checkpoint was written yet"
    return f"the last complete checkpoint is {path} (epoch {epoch})"


_MIXED_DRIFT = (" (mixed precision: float32 weights of two runs that may round their half products differently, "
                "not expected to agree to float32 precision)")


def _agreement(config: TrainConfig, records: list) -> str | None:
    """What the largest weight difference means: how closely the run's first step agreed, and why they drift."""
    rel = first_step_agreement(records)
    if rel is None:  # resumed from a checkpoint of a version that did not record it
        return None
    line = f"  the first step's gradients agreed to {rel:.1e} (largest relative difference)"
    if config.is_mixed:
        return line
    line += (f": {config.dtype} rounding, which the optimizer's steps amplify as they would between two runs that "
             f"sum in another order")
    if config.dtype == "float32":
        line += " (--dtype float64 keeps the drift far smaller)"
    return line + ("; curves.png plots the drift over steps" if config.plots else "")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _precision(config: TrainConfig) -> str:
    if not config.is_mixed:
        return config.dtype
    scale = ", dynamic loss scale" if config.dtype == "float16" else ""
    return f"{config.dtype} mixed precision: float32 data and master weights{scale}"


def _mixed_summary(config: TrainConfig, impls: dict) -> dict:
    """What summary.json says of a mixed-precision run: the compute dtype, what max_param_abs_diff compares, and
    (float16) each implementation's final loss scale."""
    info = {"compute_dtype": config.dtype, "weights": "float32 (the manual run's master weights)",
            "max_param_abs_diff": "between float32 weights of runs that each round their products to "
                                  f"{config.dtype} their own way: how far they drift apart, not an error bound"}
    scales = {name: impl.scaler.get_scale() for name, impl in impls.items()
              if getattr(impl, "scaler", None) is not None}
    if scales:
        info["loss_scale"] = scales
    return info


def _finish(config: TrainConfig, out: Path, impls: dict, data, records: list, say: Callable,
            info: DistInfo, monitors: dict) -> None:
    """Evaluate on the test split (every rank: it is sharded); rank 0 writes summary.json and the figures."""
    results = {}
    for name, impl in impls.items():
        test_loss, test_acc = evaluate(impl, data.test_x, data.test_y, info=info)
        rows = [r for r in records if r["type"] == "epoch" and r["impl"] == name]
        results[name] = {"test_accuracy": test_acc, "test_loss": test_loss, "train_loss": rows[-1]["train_loss"],
                         "seconds_per_epoch": sum(h["seconds"] for h in rows) / len(rows)}
    summary = {"dataset": config.dataset, "model": config.model, "epochs": max(r["epoch"] for r in records),
               "results": results, "max_param_abs_diff": max_param_abs_diff(impls)}
    if info.enabled:
        summary["world_size"] = info.world_size
    if config.is_mixed:
        summary["mixed_precision"] = _mixed_summary(config, impls)
    if not info.is_main:
        return
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    written = ["summary.json", "metrics.jsonl", "checkpoint.pt"]
    if config.plots:
        from .plots import write_plots
        written += [p.name for p in write_plots(out, records)]
    written += write_monitor_outputs(out, monitors, config.plots)

    say(f"\n{'impl':<8}{'test acc':>10}{'test loss':>11}{'train loss':>12}{'s/epoch':>10}")
    for name, r in results.items():
        say(f"{name:<8}{r['test_accuracy']:>10.2%}{r['test_loss']:>11.4f}{r['train_loss']:>12.4f}"
            f"{r['seconds_per_epoch']:>10.2f}")
    if summary["max_param_abs_diff"] is not None:
        say(f"largest weight difference between implementations after {_count(summary['epochs'], 'epoch')}: "
            f"{summary['max_param_abs_diff']:.3e}{_MIXED_DRIFT if config.is_mixed else ''}")
        agreement = _agreement(config, records)
        if agreement:
            say(agreement)
    say(f"wrote {', '.join(str(out / w) if i == 0 else w for i, w in enumerate(written))}")
