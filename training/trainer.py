"""run(config): a whole training run — data, models, epochs, checkpoints, evaluation, summary and figures.

Outputs go to config.out: metrics.jsonl (every logged record), checkpoint.pt (atomically, after every epoch),
summary.json and PNG figures at the end.  A run resumed from its checkpoint writes the same files as one that
was never interrupted; a checkpoint that already holds every epoch only completes the outputs.  The folder is
locked for the whole run and created only once the run starts (training/storage/output.py); a full disk stops the run
with one line, the last complete checkpoint kept.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch

from .allocator import retain_freed_memory
from .config import TrainConfig
from .config.resume import resumed, settings_to_save
from .config.run import RunConfig
from .device import resolve_device
from .drift import MIXED_DRIFT, Drift, agreement, drift_note
from .errors import EXIT_FAILED, EXIT_OK, Interrupted, NonFiniteLoss, RunFailed, UsageError
from .impls import build_impls, check_mixed_precision, max_param_abs_diff
from .impls.state import impls_state, restore
from .monitors import (
    attach_monitors,
    close_tensorboard,
    log_scalars,
    monitor_state,
    open_tensorboard,
    restore_monitors,
    write_monitor_outputs,
)
from .parallel.checkpoint import restore_sharded, sharded_state
from .parallel.distributed import DistInfo
from .parallel.launch import under_torchrun
from .parallel.verify.agreement import check_ranks_agree, run_identity
from .storage.checkpoint import check_data, checkpoint_state, read_checkpoint, save_checkpoint
from .storage.files import WriteFailed, atomic_write_text
from .storage.output import OutputFolder, default_out
from .tasks.task import Task, make_task, task_class
from .threads import use_threads


def run(
    config: TrainConfig, say: Callable | None = None, *, init_method: str | None = None, info: DistInfo | None = None
) -> int:
    """Train as ``config`` says; return the exit status (0, or 1 for a non-finite loss).  Ctrl-C says where the
    last complete checkpoint is and raises Interrupted, a KeyboardInterrupt (the command line makes it exit 130).

    Raises UsageError for bad settings, missing or other data, a damaged checkpoint or an unusable or busy output
    folder, before anything is trained; RunFailed when the run cannot go on (a write fails, another rank failed).
    Under torchrun (or with ``info``/``init_method`` given, as tests do) every rank runs this; rank 0 alone prints
    and writes files.
    """
    threads = use_threads(config.run.threads)
    retain_freed_memory()  # activations are not returned to the system and faulted back in at every step
    device = resolve_device(config.run.device)
    with under_torchrun(device, config.run.dist_timeout, init_method, info) as (info, device):
        quiet = config.run.quiet or not info.is_main
        return _run(config, device, info, say or ((lambda *a, **k: None) if quiet else print), threads)


def _run(config: TrainConfig, device: torch.device, info: DistInfo, say: Callable, threads: str) -> int:
    ckpt, resume = None, config.run.resume
    if resume is not None:
        ckpt = read_checkpoint(resume)
        config = resumed(config, ckpt, info.world_size)  # its settings (a model-parallel run: its split too)
        saved_world = ckpt.get("world_size", 1)
        if saved_world != info.world_size:
            say(
                f"note: the checkpoint was trained on {saved_world} process(es), this run has {info.world_size}; "
                f"the global batch is the same, so it continues the same run (sums are taken in another order)"
            )
    check_mixed_precision(config.run, info)
    out = config.run.out or (resume.parent if resume else default_out())
    task_class(config.family).check_source(config.data)
    folder = OutputFolder(out, resume, config.run.overwrite) if info.is_main else None
    try:  # rank 0 holds the output folder's lock from here to the end of the run
        if folder is not None:
            folder.check()
        return _train(config, device, info, say, ckpt, out, folder, threads)
    finally:
        if folder is not None:
            folder.release()


def _build(config: TrainConfig, device: torch.device, info: DistInfo, task: Task) -> dict:
    """build_impls on the task's models, with a model too large for the device's memory as one line naming its size
    settings."""
    try:
        models = task.build_models(device, config.run.torch_dtype, info)
        if config.model_parallel:  # the GPT split over the ranks (training/parallel/run.py)
            from .parallel.run import build_parallel_impls

            return build_parallel_impls(
                models,
                config.parallel,
                config.optim,
                info,
                batch_size=config.data.batch_size,
                total_steps=task.total_steps,
            )
        return build_impls(
            models, config.optim, config.run, device, info, total_steps=task.total_steps, model=config.model.name
        )
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:
        text = str(e)
        if not isinstance(e, (torch.OutOfMemoryError, MemoryError)) and "allocate" not in text:
            raise
        size = re.search(r"allocate (\d+) bytes", text)
        tried = f"{int(size.group(1)) / 1e9:.1f} GB at once" if size else text.strip().splitlines()[0][:120]
        raise UsageError(
            f"{task.size_flags()}: the models do not fit in the memory of {device} (torch could not "
            f"allocate {tried}); use a smaller model"
        ) from None


def _train(
    config: TrainConfig,
    device: torch.device,
    info: DistInfo,
    say: Callable,
    ckpt: dict | None,
    out: Path,
    folder: OutputFolder | None,
    threads: str,
) -> int:
    run = config.run
    resume = cast(Path, run.resume)  # read only where ckpt is not None: the checkpoint was read from it
    task = make_task(config.family, config.model, config.data, run, device, say)
    if ckpt is not None:
        check_data(ckpt, task.fingerprint, resume, task.data_name)
    check_ranks_agree(info, run_identity(config.shared(), device, task.fingerprint, ckpt))
    if not config.model_parallel:  # a model-parallel run checks its own world (training/parallel/run.py)
        task.check(info)
    impls = _build(config, device, info, task)
    if config.parallel.check_parity:  # the first step sharded and in one process, compared; nothing is trained
        from .parallel.verify.parity import check_parity

        return check_parity(impls["manual"], task, config.optim, run, device, info, say)
    writer = open_tensorboard(run, info)
    monitors = attach_monitors(impls, run, info, task.round_ends, writer, task.watch_activations)
    batch_gen = torch.Generator().manual_seed((run.seed + 1) % 2**64)  # torch's range
    records: list[dict] = []  # everything logged, in order; rounds are the records of type "epoch"
    start = 1
    if ckpt is not None:
        if config.model_parallel:  # each rank's own shards (training/parallel/checkpoint.py)
            restore_sharded(impls["manual"], ckpt, batch_gen, info.rank, task.steps_per_round, resume)
        else:
            restore(impls, ckpt, batch_gen, device, task.steps_per_round, resume, say)
        records = list(ckpt["records"])
        restore_monitors(monitors, ckpt)
        start = ckpt["epoch"] + 1
        say(f"resuming from {resume} after {task.round_name(ckpt['epoch'])}")
    ckpt_path = out / "checkpoint.pt"
    saved_epoch = None if ckpt is None or ckpt_path.resolve() != resume.resolve() else ckpt["epoch"]
    metrics_file = None
    if folder is not None:  # the run is sure to start: its folder is made (and claimed) now
        folder.create(say)
        metrics_path = out / "metrics.jsonl"
        # Rewrite the log from what the checkpoint vouches for, so a half-finished epoch leaves no stray lines.
        atomic_write_text(metrics_path, "".join(json.dumps(r) + "\n" for r in records))
        metrics_file = open(metrics_path, "a")  # noqa: SIM115 (held for the whole run, closed in its finally)

    def log(rec: dict) -> None:
        if metrics_file is not None:
            try:
                metrics_file.write(json.dumps(rec) + "\n")
                metrics_file.flush()
            except OSError as e:
                raise WriteFailed(metrics_path, e, "its complete lines are kept (--resume rewrites it)") from e
        log_scalars(writer, rec)
        records.append(rec)

    say(
        f"{task.describe(device)} ({_precision(run)}; {threads}); "
        f"loaded in {task.data_seconds:.2f} s; model {config.model.name}; impl {', '.join(impls)}; "
        f"{f'{info.world_size} processes; ' if info.enabled else ''}"
        f"{impls['manual'].describe() + '; ' if config.model_parallel else ''}output {out}"
    )
    drift = Drift(impls, task.steps_per_round, log) if len(impls) > 1 else None
    try:
        for r in range(start, task.rounds + 1):
            order = task.round_order(r, batch_gen)  # drawn once: every implementation trains on the same batches
            for name, impl in impls.items():
                rec = {
                    "type": "epoch",
                    "impl": name,
                    "epoch": r,
                    **task.train_round(impl, order, r, log, info, drift.after_step if drift is not None else None),
                }
                rec.update(task.evaluate_round(impl, r, info))
                log(rec)
                say(task.round_line(r, name, rec))
            if drift is not None:
                diff = drift.end_epoch(r)
                say(
                    f"{task.round_name(r, pad=True)} largest weight difference between {', '.join(impls)}: {diff:.3e}"
                    f"{drift_note(run)}"
                )
            # a smoke test leaves no checkpoint (tens of MB) behind; a model-parallel run's ranks send rank 0 theirs
            sharded = {}
            if config.model_parallel and not run.dry_run:
                sharded = sharded_state(impls["manual"], config.parallel.split(), info)
            if info.is_main and not run.dry_run:
                state = checkpoint_state(
                    settings_to_save(config), impls_state(impls), r, records, batch_gen, task.fingerprint
                )
                save_checkpoint(
                    ckpt_path,
                    {
                        **state,
                        **task.checkpoint_extra(),
                        "world_size": info.world_size,
                        "monitor": monitor_state(monitors),
                        **sharded,
                    },
                )
                saved_epoch = r
            if run.dry_run:
                break
        _finish(config, out, impls, task, records, say, info, monitors)
    except NonFiniteLoss as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"\ninterrupted; {_last_checkpoint(ckpt_path, saved_epoch, task)}", file=sys.stderr)
        raise Interrupted from None
    except WriteFailed as e:
        raise RunFailed(f"{e}; {_last_checkpoint(ckpt_path, saved_epoch, task)}") from None
    finally:
        if metrics_file is not None:
            with contextlib.suppress(OSError):  # every line was flushed; after a failed write, nothing more to say
                metrics_file.close()
        close_tensorboard(writer)
    return EXIT_OK


def _last_checkpoint(path: Path, r: int | None, task: Task) -> str:
    if r is None:
        return "no checkpoint was written yet"
    return f"the last complete checkpoint is {path} ({task.round_name(r)})"


def _precision(run: RunConfig) -> str:
    if not run.is_mixed:
        return run.dtype
    scale = ", dynamic loss scale" if run.dtype == "float16" else ""
    return f"{run.dtype} mixed precision: float32 data and master weights{scale}"


def _mixed_summary(run: RunConfig, impls: dict) -> dict:
    """What summary.json says of a mixed-precision run: the compute dtype, what max_param_abs_diff compares, and
    (float16) each implementation's final loss scale."""
    info: dict[str, object] = {
        "compute_dtype": run.dtype,
        "weights": "float32 (the manual run's master weights)",
        "max_param_abs_diff": "between float32 weights of runs that each round their products to "
        f"{run.dtype} their own way: how far they drift apart, not an error bound",
    }
    scales = {
        name: impl.scaler.get_scale() for name, impl in impls.items() if getattr(impl, "scaler", None) is not None
    }
    if scales:
        info["loss_scale"] = scales
    return info


def _finish(
    config: TrainConfig,
    out: Path,
    impls: dict,
    task: Task,
    records: list,
    say: Callable,
    info: DistInfo,
    monitors: dict,
) -> None:
    """The task's final figures (every rank: the test split is sharded); rank 0 writes summary.json and the
    figures."""
    results = {
        name: task.results(impl, [r for r in records if r["type"] == "epoch" and r["impl"] == name], info)
        for name, impl in impls.items()
    }
    run = config.run
    summary = {
        "dataset": config.data.dataset,
        "model": config.model.name,
        **task.extent(records),
        "results": results,
        "max_param_abs_diff": max_param_abs_diff(impls),
    }
    if info.enabled:
        summary["world_size"] = info.world_size
    if run.is_mixed:
        summary["mixed_precision"] = _mixed_summary(run, impls)
    # a pipelined run's timeline (parallel/verify/pipeline_report.py; collective, so before rank 0 goes on alone)
    timeline, timeline_lines = (
        impls["manual"].write_timeline(out, info.is_main, run.plots) if config.model_parallel else ([], [])
    )
    if not info.is_main:
        return
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    written = ["summary.json", "metrics.jsonl"] + ([] if run.dry_run else ["checkpoint.pt"])
    written += timeline
    for line in timeline_lines:
        say(line)
    if run.plots:
        from .plots import write_plots

        written += [p.name for p in write_plots(out, records, task.kind)]
    written += write_monitor_outputs(out, monitors, run.plots)

    for line in task.results_table(results):
        say(line)
    if summary["max_param_abs_diff"] is not None:
        say(
            f"largest weight difference between implementations after {task.extent_words(summary)}: "
            f"{summary['max_param_abs_diff']:.3e}{MIXED_DRIFT if run.is_mixed else ''}"
        )
        meaning = agreement(run, records)
        if meaning:
            say(meaning)
    say(f"wrote {', '.join(str(out / w) if i == 0 else w for i, w in enumerate(written))}")
