"""A monitor record as TensorBoard scalars and histograms (torch.utils.tensorboard.SummaryWriter).

Histograms go in with ``add_histogram_raw`` from the counts the monitor already has, so nothing is
read from the device again.  Tags: ``grad_norm/<param>``, ``grad_abs_max/<param>``, ``param_norm/<param>``,
``update_ratio/<param>`` (at the step whose update it measures), ``grad_norm/total``,
``grad_norm/total_after_clip``, ``grad/<param>`` (histogram), ``activation_mean/<layer>``,
``activation_std/<layer>``, ``dead_fraction/<layer>``, ``saturated_fraction/<layer>``; each prefixed with
``<prefix>/`` when a prefix (the monitor's name) is given.
"""

from __future__ import annotations

from .records import hist_edges


def to_tensorboard(writer, record: dict, prefix: str = "") -> None:
    """Write one record's scalars and gradient histograms at global step ``record["step"]``."""
    p = f"{prefix}/" if prefix else ""
    step = record["step"]
    writer.add_scalar(f"{p}grad_norm/total", record["total_grad_norm"], step)
    if record.get("total_grad_norm_after_clip") is not None:
        writer.add_scalar(f"{p}grad_norm/total_after_clip", record["total_grad_norm_after_clip"], step)
    span = record.get("update_ratio_span")
    for name, s in record["params"].items():
        writer.add_scalar(f"{p}param_norm/{name}", s["param_norm"], step)
        if span is not None and s.get("update_ratio") is not None:
            writer.add_scalar(f"{p}update_ratio/{name}", s["update_ratio"], span[0])
        if s.get("grad_norm") is None:
            continue
        writer.add_scalar(f"{p}grad_norm/{name}", s["grad_norm"], step)
        writer.add_scalar(f"{p}grad_abs_max/{name}", s["grad_abs_max"], step)
        num = sum(s["hist_counts"])
        if num == 0 or s["grad_nonfinite"]:  # NaN/inf in min, max and sums: the scalars show them instead
            continue
        writer.add_histogram_raw(
            f"{p}grad/{name}",
            min=s["grad_min"],
            max=s["grad_max"],
            num=num,
            sum=s["grad_mean"] * s["numel"],
            sum_squares=s["grad_norm"] ** 2,
            bucket_limits=hist_edges(s)[1:],
            bucket_counts=s["hist_counts"],
            global_step=step,
        )
    for name, a in record.get("activations", {}).items():
        writer.add_scalar(f"{p}activation_mean/{name}", a["mean"], step)
        writer.add_scalar(f"{p}activation_std/{name}", a["std"], step)
        for key in ("dead_fraction", "saturated_fraction"):
            if key in a:
                writer.add_scalar(f"{p}{key}/{name}", a[key], step)
