"""Figures of a GradientMonitor's records (matplotlib, Agg): one PNG per question, runs side by side.

plot_records(records, out_dir) writes, where the records hold the data for it:
    grad_norm_per_layer.png  gradient norm of each parameter over steps (log scale)
    grad_norm_total.png      total gradient norm before and after clipping
    update_ratio.png         |update| / |weight| per parameter (log scale) with the 1e-3 rule-of-thumb line
    grad_histograms.png      each weight matrix's (or kernel's) gradient histogram at the first, middle and last record
    activations.png          per-layer output mean and std; dead-ReLU and saturated tanh/sigmoid fractions
Pass ``{"manual": records, "torch": records}`` to draw several runs as columns of the same figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

DPI = 80
MAX_HIST_ROWS = 6  # the histogram figure shows the weight matrices and kernels (biases and norms' vectors are too
# small for a histogram), the first 6 of them


def plot_records(
    records: list[dict] | Mapping[str, list[dict]], out_dir: str | Path, prefix: str = "", write_file=None
) -> list[Path]:
    """Render the figures listed above into ``out_dir`` (file names prefixed with ``prefix``); -> paths written.
    ``write_file(path, write)`` writes each file, calling ``write(f)`` on a binary file (the trainer passes its
    atomic writer, training.storage.files.atomic_write); default: ``open(path, "wb")``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .axes import distinct_colors, integer_axis, log_axis, series_style

    runs = dict(records) if isinstance(records, Mapping) else {"": list(records)}
    runs = {k: v for k, v in runs.items() if v}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not runs:
        return []
    written: list[Path] = []

    def figure(rows: int, height: float):
        fig, axes = plt.subplots(rows, len(runs), figsize=(5.5 * len(runs), height * rows), squeeze=False)
        return fig, axes

    def save(fig, name: str) -> None:
        fig.tight_layout()
        path = out / f"{prefix}{name}"
        try:
            (write_file or _write_file)(path, lambda f: fig.savefig(f, dpi=DPI, format=path.suffix[1:]))
        finally:
            plt.close(fig)
        written.append(path)

    def titled(ax, run: str, what: str) -> None:
        ax.set_title(f"{run}: {what}" if run else what, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        integer_axis(ax)

    # gradient norm per parameter
    fig, axes = figure(1, 3.8)
    for ax, (run, recs) in zip(axes[0], runs.items(), strict=True):
        distinct_colors(ax, len(recs[0]["params"]))
        for name in recs[0]["params"]:
            pts = [
                (r["step"], r["params"][name]["grad_norm"])
                for r in recs
                if r["params"].get(name, {}).get("grad_norm") is not None
            ]
            if pts:
                ax.plot(*zip(*pts, strict=True), label=name, lw=1, **series_style(len(pts)))
        log_axis(ax)
        titled(ax, run, "gradient norm per parameter")
        ax.legend(fontsize=6)
    save(fig, "grad_norm_per_layer.png")

    # total norm before / after clipping
    fig, axes = figure(1, 3.5)
    for ax, (run, recs) in zip(axes[0], runs.items(), strict=True):
        before = {r["step"]: r["total_grad_norm"] for r in recs}
        after = [
            (r["step"], r["total_grad_norm_after_clip"])
            for r in recs
            if r.get("total_grad_norm_after_clip") is not None
        ]
        clipped = any(abs(b - before[s]) > 1e-6 * before[s] for s, b in after)
        ax.plot(list(before), list(before.values()), label="before clipping", lw=1, **series_style(len(before)))
        if clipped:
            ax.plot(*zip(*after, strict=True), "--", label="after clipping", lw=1, **series_style(len(after)))
            ax.legend(fontsize=7)
        log_axis(ax)
        titled(ax, run, "total gradient norm" + ("" if clipped else " (never clipped)"))
    save(fig, "grad_norm_total.png")

    # update-to-weight ratio
    if any(r.get("update_ratio_span") for recs in runs.values() for r in recs):
        fig, axes = figure(1, 3.8)
        for ax, (run, recs) in zip(axes[0], runs.items(), strict=True):
            distinct_colors(ax, len(recs[0]["params"]))
            for name in recs[0]["params"]:
                pts = [
                    (r["update_ratio_span"][0], r["params"][name]["update_ratio"])
                    for r in recs
                    if r.get("update_ratio_span") and r["params"].get(name, {}).get("update_ratio") is not None
                ]
                if pts:
                    ax.plot(*zip(*pts, strict=True), label=name, lw=1, **series_style(len(pts)))
            ax.axhline(1e-3, color="k", ls="--", lw=1, label="1e-3")
            log_axis(ax)
            titled(ax, run, "update / weight (norms)")
            ax.legend(fontsize=6)
        save(fig, "update_ratio.png")

    # gradient histograms at the first, middle and last record
    params = next(iter(runs.values()))[0]["params"]
    names = [n for n, p in params.items() if len(p["shape"]) >= 2] or list(params)  # matrices, kernels
    names = names[:MAX_HIST_ROWS]
    fig, axes = figure(len(names), 2.4)
    for col, (run, recs) in enumerate(runs.items()):
        picks = sorted({0, len(recs) // 2, len(recs) - 1})
        for row, name in enumerate(names):
            ax = axes[row][col]
            for i in picks:
                s = recs[i]["params"].get(name)
                if s is None or s.get("hist_counts") is None:
                    continue
                lo, hi = s["hist_range"]
                k = len(s["hist_counts"])
                ax.stairs(
                    s["hist_counts"], [lo + (hi - lo) * j / k for j in range(k + 1)], label=f"step {recs[i]['step']}"
                )
            log_axis(ax, nonpositive="mask")
            shape = "x".join(map(str, params[name]["shape"]))
            ax.set_title(f"{run}: {name} ({shape})" if run else f"{name} ({shape})", fontsize=9)
            ax.set_ylabel("count", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=7)
    axes[-1][0].set_xlabel("gradient value")
    save(fig, "grad_histograms.png")

    # activations
    if any(r.get("activations") for recs in runs.values() for r in recs):
        fig, axes = figure(3, 3.2)
        for col, (run, recs) in enumerate(runs.items()):
            ax_mean, ax_std, ax_frac = (axes[row][col] for row in range(3))
            layers = list(dict.fromkeys(n for r in recs for n in r.get("activations", {})))
            for ax in (ax_mean, ax_std, ax_frac):
                distinct_colors(ax, len(layers))
            for name in layers:
                rows = [(r["step"], r["activations"][name]) for r in recs if name in r.get("activations", {})]
                steps = [s for s, _ in rows]
                label = f"{name} ({rows[0][1]['layer']})"
                style = series_style(len(steps))
                (line,) = ax_mean.plot(steps, [a["mean"] for _, a in rows], lw=1, label=label, **style)
                ax_std.plot(steps, [a["std"] for _, a in rows], lw=1, label=label, color=line.get_color(), **style)
                for key, ls in (("dead_fraction", "-"), ("saturated_fraction", "--")):
                    if key in rows[0][1]:
                        ax_frac.plot(
                            steps,
                            [a[key] for _, a in rows],
                            ls,
                            lw=1,
                            color=line.get_color(),
                            label=f"{label} {key.split('_')[0]}",
                            **style,
                        )
            titled(ax_mean, run, "layer output mean")
            titled(ax_std, run, "layer output std")
            titled(ax_frac, run, "dead ReLU units / saturated tanh, sigmoid outputs")
            ax_frac.set_ylim(-0.02, 1.02)
            if not layers:  # a model without forward hooks (the autodiff engine's)
                ax_mean.text(
                    0.5,
                    0.5,
                    "no activation statistics\n(no forward hooks)",
                    ha="center",
                    va="center",
                    transform=ax_mean.transAxes,
                    fontsize=8,
                )
            for ax in (ax_mean, ax_std, ax_frac):
                if ax.lines:
                    ax.legend(fontsize=6)
        save(fig, "activations.png")
    return written


def _write_file(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)
