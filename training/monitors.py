"""--monitor and --tensorboard: a monitoring.GradientMonitor on every implementation of a run, side by side.

Each implementation's ``train_step`` calls ``monitor.update(global_step)`` after backward (and after the
gradients were all-reduced, under torchrun) and ``update_after_clip()`` after clipping; the monitors record
every ``log_interval`` steps, at the run's first step and at each epoch's last (a run shorter than the interval
is recorded too).  Activation statistics are gathered for the hand-written model and the
nn.Module twin of the image runs (the engine's models have no forward hooks, and the hand-written language
models are not ``layers.Sequential`` trees: their runs record gradients, weights and updates only).  Under torchrun rank
0 alone monitors: the gradients are the same on every rank after the all-reduce; the activation statistics are rank 0's
slice of each batch.  In a mixed-precision run the manual implementation's monitor reads the float32 master weights
and their unscaled gradients (the twin's: its float32 weights, unscaled by GradScaler before they are clipped).
Records go into the checkpoint, so a resumed run's monitor files cover the whole run.
"""

from __future__ import annotations

from pathlib import Path

from .config.run import RunConfig
from .errors import UsageError
from .parallel.distributed import DistInfo
from .storage.files import atomic_write, atomic_write_text


def open_tensorboard(run: RunConfig, info: DistInfo):
    """A SummaryWriter on --tensorboard's folder (rank 0 only), or None."""
    if run.tensorboard is None or not info.is_main:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UsageError(
            "--tensorboard needs the tensorboard package: pip install tensorboard "
            "(or the project's train extra: pip install -e '.[train]')"
        ) from None
    try:
        return SummaryWriter(log_dir=str(run.tensorboard))
    except OSError as e:
        raise UsageError(
            f"--tensorboard {run.tensorboard}: cannot write there ({e.strerror or type(e).__name__})"
        ) from None


def attach_monitors(
    impls: dict, run: RunConfig, info: DistInfo, round_ends: set[int], writer=None, activations: bool = True
) -> dict:
    """impl name -> GradientMonitor, set as ``impl.monitor`` (empty unless --monitor, or off rank 0); besides every
    ``log_interval`` steps each records the run's first step and the steps in ``round_ends`` (each epoch's last,
    or each evaluation's).  ``activations``: also per-layer activation statistics (not for the engine's models,
    which have no forward hooks)."""
    if not run.monitor or not info.is_main:
        return {}
    from monitoring import GradientMonitor

    monitors = {}
    for name, impl in impls.items():
        # mixed precision: weights and gradients are the float32 masters' (unscaled, as they are clipped)
        mon = GradientMonitor(
            impl.model,
            every=run.log_interval,
            name=name,
            tensorboard=writer,
            parameters=getattr(impl, "master", None),
            also={1, *round_ends},
        )
        if activations and name != "engine":
            mon.watch_activations()
        impl.monitor = monitors[name] = mon
    return monitors


def monitor_state(monitors: dict) -> dict:
    """What the checkpoint keeps, per implementation: the records so far and what the next update needs."""
    return {name: mon.state_dict() for name, mon in monitors.items()}


def restore_monitors(monitors: dict, ckpt: dict) -> None:
    """Continue each monitor from the checkpoint; a checkpoint of an unmonitored run starts them afresh."""
    saved = ckpt.get("monitor") or {}
    for name, mon in monitors.items():
        if name in saved:
            mon.load_state_dict(saved[name])


def write_monitor_outputs(out: Path, monitors: dict, plots: bool) -> list[str]:
    """monitor_<impl>.jsonl per implementation and the figures, every implementation side by side."""
    if not monitors:
        return []
    written = []
    for name, mon in monitors.items():
        path = mon.to_jsonl(out / f"monitor_{name}.jsonl", atomic_write_text)
        written.append(path.name)
    if plots:
        from monitoring import plot_records

        written += [
            p.name
            for p in plot_records(
                {n: m.records for n, m in monitors.items()}, out, prefix="monitor_", write_file=atomic_write
            )
        ]
    for mon in monitors.values():
        mon.remove()
    return written


def log_scalars(writer, rec: dict) -> None:
    """A metrics record as TensorBoard scalars: step and epoch records tagged by implementation, the weight
    difference between implementations as ``drift/max_param_abs_diff`` (by step)."""
    if writer is None:
        return
    if rec["type"] == "drift":
        writer.add_scalar("drift/max_param_abs_diff", rec["max_param_abs_diff"], rec["step"])
        return
    name = rec["impl"]
    if rec["type"] == "step":
        for key in ("loss", "train_loss", "train_acc"):
            if key in rec:  # a language model's steps have no accuracy
                writer.add_scalar(f"{name}/step/{key}", rec[key], rec["global_step"])
    elif rec["type"] == "epoch":  # an image run's epoch, or a text run's evaluation (by iteration)
        tag, x = ("eval", rec["iter"]) if "iter" in rec else ("epoch", rec["epoch"])
        for key in ("train_loss", "train_acc", "val_loss", "val_acc"):
            if rec.get(key) is not None:
                writer.add_scalar(f"{name}/{tag}/{key}", rec[key], x)


def close_tensorboard(writer) -> None:
    if writer is not None:
        writer.flush()
        writer.close()
