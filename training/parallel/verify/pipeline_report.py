"""A pipelined run's timeline in its output folder: the schedule on the unit-cost clock and the step it measured.

``pipeline_timeline.txt`` holds the schedule's timeline (``pipeline_schedules.render``: F = B = W = 1 unit, its
bubble against the formula), then what one copy of the model did in the run's last step: each stage's executed
actions (``pipeline_runtime.format_trace``: start and length in ms) and the measured bubble,

    measured bubble = 1 - (sum over stages of the time in F, B and W) / (P x the longest stage's span)

a stage's span running from its first action's start (the step's start, or its first receive) to its last
action's end: the share of the P ranks' time the step spent waiting or communicating, not computing.  On a CPU
shared by the ranks (this machine's two cores, four processes) it is a figure of this run, not of the schedule.
``pipeline_timeline.png`` is the unit-cost timeline drawn by ``pipeline_plot``.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from ..pipeline_runtime import format_trace
from ..pipeline_schedules import COMPUTE, render

TEXT, PNG = "pipeline_timeline.txt", "pipeline_timeline.png"


def gather_traces(trace: list, group: dist.ProcessGroup) -> list[list]:
    """Every stage's trace of the last step, in stage order (collective over the pipeline group)."""
    every: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, trace, group=group)
    return every


def measured_bubble(traces: list[list]) -> float:
    """The idle share of the ranks' time in one step (see the module); each trace (op, micro-batch, stage, start,
    end)."""
    spans = [t[-1][4] - t[0][3] for t in traces if t]
    busy = sum(end - start for t in traces for op, _, _, start, end in t if op in COMPUTE)
    return 1.0 - busy / (len(traces) * max(spans)) if spans and max(spans) > 0 else 0.0


def timeline_lines(schedule: str, micro_batches: int, traces: list[list], virtual_stages: int = 1) -> list[str]:
    """The text of ``pipeline_timeline.txt`` (and of what the run prints), one line a list item."""
    stages = len(traces)  # the pipeline's ranks
    lines = [f"pipeline schedule {schedule}, {stages} ranks, {micro_batches} micro-batches, on the unit-cost clock:"]
    lines += render(schedule, stages, micro_batches, virtual_stages).splitlines()
    lines.append("the run's last step, by rank in the pipeline: action micro-batch [s stage] @ start + length, ms")
    lines += [format_trace(s, t) for s, t in enumerate(traces)]
    lines.append(
        f"measured bubble of that step: {measured_bubble(traces):.3f} (idle share of the {stages} ranks' "
        f"time, wall clock)"
    )
    return lines


def write_timeline(
    out: Path, schedule: str, micro_batches: int, traces: list[list], png: bool, virtual_stages: int = 1
) -> tuple[list, list]:
    """Write the text (and with ``png`` the figure) into ``out``; -> (the files' names, the text's lines)."""
    from ...storage.files import atomic_write_text

    lines = timeline_lines(schedule, micro_batches, traces, virtual_stages)
    atomic_write_text(Path(out) / TEXT, "\n".join(lines) + "\n")
    written = [TEXT]
    if png:
        from .pipeline_plot import write_timeline_png

        write_timeline_png(Path(out) / PNG, schedule, len(traces), micro_batches, virtual_stages)
        written.append(PNG)
    return written, lines
