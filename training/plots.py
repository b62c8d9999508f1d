"""The run's figure, from its metrics records (curves.png): loss and accuracy per epoch (a text run: train and
validation loss at each evaluation, by iteration), and, where several
implementations trained side by side, their largest weight difference over steps.  --monitor's figures are
monitoring.plot_records' (training/monitors.py)."""

from __future__ import annotations

from pathlib import Path

from .storage.files import atomic_write


def write_plots(out: Path, records: list, kind: str = "image") -> list[Path]:
    """Render curves.png into ``out``; return the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from monitoring.axes import integer_axis, log_axis, plain_axis, series_style, twin_style

    history = [r for r in records if r["type"] == "epoch"]
    drift = [r for r in records if r["type"] == "drift" and "step" in r]
    impls = list(dict.fromkeys(h["impl"] for h in history))
    text = kind == "text"
    panels = (1 if text else 2) + bool(drift)
    fig, grid = plt.subplots(1, panels, figsize=(5.5 * panels, 4), squeeze=False)
    axes = list(grid[0])
    ax_loss, ax_acc = axes[0], (None if text else axes[1])
    x_key = "iter" if text else "epoch"
    for i, name in enumerate(impls):
        rows = [h for h in history if h["impl"] == name]
        ep = [h[x_key] for h in rows]
        style = twin_style(i)
        (line,) = ax_loss.plot(ep, [h["train_loss"] for h in rows], "-", label=f"{name} train", **style)
        if ax_acc is not None:
            ax_acc.plot(ep, [h["train_acc"] for h in rows], "-", color=line.get_color(), label=f"{name} train", **style)
        val = [h for h in rows if h.get("val_loss") is not None]
        if val:
            ve = [h[x_key] for h in val]
            for ax, key in ((ax_loss, "val_loss"), (ax_acc, "val_acc")):
                if ax is not None:
                    ax.plot(
                        ve,
                        [h[key] for h in val],
                        "--",
                        color=line.get_color(),
                        alpha=0.6,
                        label=f"{name} val",
                        **{**style, "marker": "s"},
                    )
    titles = (
        (ax_loss, "cross-entropy loss per character (nats)" if text else "cross-entropy loss"),
        (ax_acc, "accuracy"),
    )
    for ax, title in titles:
        if ax is None:
            continue
        ax.set_xlabel("iteration" if text else "epoch")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.margins(y=0.1)  # room for the larger, hollow markers
        integer_axis(ax)
        plain_axis(ax)
    if drift:
        ax = axes[-1]
        steps = [r["step"] for r in drift]
        diffs = [max(r["max_param_abs_diff"], 1e-300) for r in drift]
        ax.plot(steps, diffs, "-", color="k", **series_style(len(drift)))
        first = next((r for r in drift if "max_grad_rel_diff" in r), None)
        if first is not None:  # a relative difference of gradients: said, not drawn on the weights' axis
            ax.text(
                0.02,
                0.96,
                f"the first step's gradients agreed to {first['max_grad_rel_diff']:.1e} (relative)",
                transform=ax.transAxes,
                ha="left",
                va="top",
                fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "0.8"},
            )
        log_axis(ax)
        log_axis(ax, "x")
        ax.set_xlabel("step")
        ax.set_title(f"largest weight difference, {' vs '.join(drift[-1]['impls'])}")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    try:  # atomically, as every file of a run: a full disk leaves no half figure and says so in one line
        atomic_write(out / "curves.png", lambda f: fig.savefig(f, dpi=100, format="png"))
    finally:
        plt.close(fig)
    return [out / "curves.png"]
