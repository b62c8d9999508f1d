"""A pipeline schedule's unit-cost timeline as a PNG: one row a stage, one box an action (F, B, W), gaps the bubble."""

from __future__ import annotations

from pathlib import Path

from ..pipeline_schedules import bubble, bubble_formula, timeline

COLOURS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868"}


def write_timeline_png(path: str | Path, schedule: str, stages: int, micro_batches: int) -> Path:
    """Draw ``timeline(schedule, stages, micro_batches)`` into ``path``; returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    line = timeline(schedule, stages, micro_batches)
    span = max(t for row in line for t, _, _ in row) + 1
    fig, ax = plt.subplots(figsize=(max(6.0, span * 0.35), 0.6 * stages + 1.2))
    for s, row in enumerate(line):
        for t, op, i in row:
            ax.add_patch(plt.Rectangle((t, s - 0.4), 1, 0.8, facecolor=COLOURS[op], edgecolor="white"))
            ax.text(t + 0.5, s, f"{op}{i}", ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(0, span)
    ax.set_ylim(stages - 0.5, -0.5)  # stage 0 on top
    ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
    ax.set_xlabel("time (F = B = W = 1 unit)")
    ax.set_title(
        f"{schedule}: {stages} stages, {micro_batches} micro-batches, bubble "
        f"{bubble(schedule, stages, micro_batches):.3f} (formula "
        f"{bubble_formula(schedule, stages, micro_batches):.3f})",
        fontsize=9,
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
