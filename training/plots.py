"""Figures of a run, from its metrics records: loss and accuracy per epoch (curves.png), gradient norms."""
from __future__ import annotations

from pathlib import Path


def write_plots(out: Path, records: list, monitor: bool) -> list[Path]:
    """Render curves.png (and grad_norms.png with --monitor) into ``out``; return the files written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = [r for r in records if r["type"] == "epoch"]
    steps = [r for r in records if r["type"] == "step"]
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
    mon = [s for s in steps if "grad_norm_before_clip" in s]
    written = [out / "curves.png"]
    if not (monitor and mon):
        return written
    fig, (ax_total, ax_layer) = plt.subplots(1, 2, figsize=(11, 4))
    for name in impls:
        rows = [s for s in mon if s["impl"] == name]
        x = [s["global_step"] for s in rows]
        ax_total.plot(x, [s["grad_norm_before_clip"] for s in rows], label=f"{name} before clip")
        ax_total.plot(x, [s["grad_norm_after_clip"] for s in rows], "--", label=f"{name} after clip")
        for pname in rows[0]["params"] if rows else []:
            if pname.endswith("weight"):
                ax_layer.plot(x, [s["params"][pname]["grad_norm"] for s in rows], label=f"{name} {pname}")
    ax_total.set_title("total gradient norm"); ax_layer.set_title("gradient norm per layer")
    for ax in (ax_total, ax_layer):
        ax.set_xlabel("step"); ax.set_yscale("log"); ax.grid(alpha=0.3); ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "grad_norms.png", dpi=100)
    plt.close(fig)
    written.append(out / "grad_norms.png")
    return written
