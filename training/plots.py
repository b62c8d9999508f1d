"""The run's figure, from its metrics records: loss and accuracy per epoch (curves.png).  --monitor's figures
are monitoring.plot_records' (training/monitors.py)."""
from __future__ import annotations

from pathlib import Path


def write_plots(out: Path, records: list) -> list[Path]:
    """Render curves.png into ``out``; return the files written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = [r for r in records if r["type"] == "epoch"]
    impls = sorted({h["impl"] for h in history})
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for name in impls:
        rows = [h for h in history if h["impl"] == name]
        ep = [h["epoch"] for h in rows]
        ax_loss.plot(ep, [h["train_loss"] for h in rows], "o-", label=f"{name} train")
        ax_acc.plot(ep, [h["train_acc"] for h in rows], "o-", label=f"{name} train")
        val = [h for h in rows if h.get("val_loss") is not None]
        if val:
            ax_loss.plot([h["epoch"] for h in val], [h["val_loss"] for h in val], "s--", label=f"{name} val")
            ax_acc.plot([h["epoch"] for h in val], [h["val_acc"] for h in val], "s--", label=f"{name} val")
    for ax, title in ((ax_loss, "cross-entropy loss"), (ax_acc, "accuracy")):
        ax.set_xlabel("epoch"); ax.set_title(title); ax.grid(alpha=0.3); ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=100)
    plt.close(fig)
    return [out / "curves.png"]
