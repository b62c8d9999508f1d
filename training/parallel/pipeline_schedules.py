"""Pipeline schedules as plain lists of actions, one list per stage, and their timeline and bubble.

An action is ``(op, micro_batch)``: "F" forward, "B" the backward's input gradient (``backward_input``), "W" the
weight gradients (``backward_weight``), and the communication around them, "recv_act"/"send_act" (the activation
from the previous stage / to the next) and "recv_grad"/"send_grad" (the input gradient from the next stage / to
the previous).  P stages, M micro-batches, stage s:

    GPipe   every F, then every backward (B then its W, dx sent after both): M activations held.  Huang et al.
            2019
    1F1B    P-1-s warm-up forwards, then one F and one backward (B then W) in turn, then the remaining backwards:
            at most P-s activations held.  Narayanan et al. 2021 (PipeDream-Flush)
    ZB-H1   1F1B's order with B and W apart: stage s runs its first s W's late, one after each later B, and the
            rest at the end, where 1F1B's stages wait for gradients.  Qi et al. 2023; torch's
            ``ScheduleInterleavedZeroBubble`` with one stage per rank builds the same lists

Each stage's W's run in the order of its B's (micro-batch order), so the gradients add into .grad in the same
order under every schedule.  ``timeline`` runs the lists on a clock where F, B and W each take one unit (the
zero-bubble paper's model) and every action waits for what it needs; the bubble is the idle share of the time.
Formulas with those costs: GPipe and 1F1B (P-1) / (M+P-1); ZB-H1 (P-1) / (3M+P-1) for M >= P, a third of it or
less.
"""

from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b", "zb-h1")
COMPUTE = ("F", "B", "W")


def compute_order(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The F, B and W actions of one stage, in the order it runs them."""
    m, s, p = micro_batches, stage, stages
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [a for i in range(m) for a in (("B", i), ("W", i))]
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    warmup = min(p - 1 - s, m)
    ops = [("F", i) for i in range(warmup)]
    backwards, weights = 0, 0

    def backward():
        nonlocal backwards, weights
        ops.append(("B", backwards))
        if schedule == "1f1b":
            ops.append(("W", backwards))
            weights += 1
        elif backwards >= s:  # ZB-H1: stage s holds back its first s W's
            ops.append(("W", weights))
            weights += 1
        backwards += 1

    for i in range(warmup, m):  # steady state: one forward, one backward
        ops.append(("F", i))
        backward()
    while backwards < m:  # cool-down: the remaining backwards
        backward()
    ops.extend(("W", i) for i in range(weights, m))  # ZB-H1: the held-back W's fill the end
    return ops


def actions(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """``compute_order`` with the sends and receives it needs: what the runtime executes."""
    out = []
    fused = schedule != "zb-h1"  # GPipe and 1F1B run the whole backward, B and W, before sending dx
    for op, i in compute_order(schedule, stage, stages, micro_batches):
        if op == "F":
            out += (
                ([("recv_act", i)] if stage > 0 else [])
                + [("F", i)]
                + ([("send_act", i)] if stage < stages - 1 else [])
            )
        elif op == "B":
            out += ([("recv_grad", i)] if stage < stages - 1 else []) + [("B", i)]
        else:
            out.append((op, i))
        if stage > 0 and (op, fused) in (("B", False), ("W", True)):
            out.append(("send_grad", i))
    return out


def timeline(schedule: str, stages: int, micro_batches: int) -> list[list[tuple[int, str, int]]]:
    """Per stage, ``(start time, op, micro_batch)`` of each F, B and W, each one unit long, each started as soon as
    its stage is free and its input is there (F after the previous stage's F, B after the next stage's B or, on the
    last stage, after its own F)."""
    orders = [compute_order(schedule, s, stages, micro_batches) for s in range(stages)]
    sent = "B" if schedule == "zb-h1" else "W"  # dx leaves a stage after its B (zero bubble) or its whole backward
    done: dict[tuple[int, str, int], int] = {}  # (stage, op, micro-batch) -> end time
    pos, free = [0] * stages, [0] * stages
    out: list[list[tuple[int, str, int]]] = [[] for _ in range(stages)]
    while any(pos[s] < len(orders[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            if pos[s] == len(orders[s]):
                continue
            op, i = orders[s][pos[s]]
            need = {
                "F": (s - 1, "F", i) if s > 0 else None,
                "B": (s + 1, sent, i) if s < stages - 1 else (s, "F", i),
                "W": (s, "B", i),
            }[op]
            if need is not None and need not in done:
                continue
            start = max(free[s], done[need] if need is not None else 0)
            done[(s, op, i)] = free[s] = start + 1
            out[s].append((start, op, i))
            pos[s] += 1
            moved = True
        if not moved:
            raise RuntimeError(
                f"schedule {schedule!r} deadlocks with {stages} stages and {micro_batches} micro-batches"
            )
    return out


def bubble(schedule: str, stages: int, micro_batches: int) -> float:
    """The idle share of the pipeline's time on the unit-cost timeline: idle slots / (stages x makespan)."""
    line = timeline(schedule, stages, micro_batches)
    span = max(t for row in line for t, _, _ in row) + 1
    return 1.0 - sum(len(row) for row in line) / (stages * span)


def bubble_formula(schedule: str, stages: int, micro_batches: int) -> float:
    p, m = stages, micro_batches
    return (p - 1) / (3 * m + p - 1) if schedule == "zb-h1" else (p - 1) / (m + p - 1)


def render(schedule: str, stages: int, micro_batches: int) -> str:
    """The timeline as text, one row per stage, one 3-character cell per time unit ('F0 ', 'B0 ', 'W0 ', ' . ')."""
    line = timeline(schedule, stages, micro_batches)
    span = max(t for row in line for t, _, _ in row) + 1
    rows = []
    for s, row in enumerate(line):
        cells = [" . "] * span
        for t, op, i in row:
            cells[t] = f"{op}{i}".ljust(3)
        rows.append(f"stage {s} |" + "".join(cells) + "|")
    measured = bubble(schedule, stages, micro_batches)
    rows.append(
        f"{schedule}: {stages} stages, {micro_batches} micro-batches, F = B = W = 1 unit: bubble "
        f"{measured:.3f} (formula {bubble_formula(schedule, stages, micro_batches):.3f})"
    )
    return "\n".join(rows)
