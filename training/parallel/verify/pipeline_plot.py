"""A pipeline schedule's unit-cost timeline as a PNG: one row a rank, one box an action (F, B, W), gaps the bubble."""

from __future__ import annotations

from pathlib import Path

from ..pipeline_schedules import bubble, bubble_formula, chunks_per_rank, timeline

COLOURS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868"}


def write_timeline_png(
    path: str | Path, schedule: str, ranks: int, micro_batches: int, virtual_stages: int = 1
) -> Path:
    """Draw ``timeline(schedule, ranks, micro_batches, virtual_stages)`` into ``path``; returns it.  With several
    stages a rank, a box names its stage after the micro-batch ('F0s2')."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    line = timeline(schedule, ranks, micro_batches, virtual_stages)
    v = chunks_per_rank(schedule, virtual_stages)
    several = v > 1
    span = max(t for row in line for t, *_ in row) + 1
    fig, ax = plt.subplots(figsize=(max(6.0, span * (0.5 if several else 0.35)), 0.6 * ranks + 1.2))
    for r, row in enumerate(line):
        for t, op, i, s in row:
            ax.add_patch(plt.Rectangle((t, r - 0.4), 1, 0.8, facecolor=COLOURS[op], edgecolor="white"))
            label = f"{op}{i}" + f"s{s}" * several
            ax.text(t + 0.5, r, label, ha="center", va="center", fontsize=6 if several else 7, color="white")
    ax.set_xlim(0, span)
    ax.set_ylim(ranks - 0.5, -0.5)  # rank 0 on top
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.set_xlabel("time (F = B = W = 1 unit)")
    ax.set_title(
        f"{schedule}: {ranks} ranks{f' x {v} stages' * several}, {micro_batches} micro-batches, "
        f"bubble {bubble(schedule, ranks, micro_batches, virtual_stages):.3f} (formula "
        f"{bubble_formula(schedule, ranks, micro_batches, virtual_stages):.3f})",
        fontsize=9,
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
