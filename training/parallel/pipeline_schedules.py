"""Pipeline schedules as plain lists of actions, one list per rank, and their timeline and bubble.

The GPT's blocks are cut into S = P x V stages; each of the P ranks holds V of them (its chunks).  An action is
``(op, micro_batch, stage)``: "F" forward, "B" the backward's input gradient (``backward_input``), "W" the weight
gradients (``backward_weight``), and the communication around them, "recv_act"/"send_act" (the activation from
the previous stage / to the next) and "recv_grad"/"send_grad" (the input gradient from the next stage / to the
previous), written only where the two stages sit on different ranks.  P ranks, M micro-batches, rank r:

    GPipe        V = 1.  Every F, then every backward (B then its W, dx sent after both): M activations held.
                 Huang et al. 2019
    1F1B         V = 1.  P-1-r warm-up forwards, then one F and one backward (B then W) in turn, then the remaining
                 backwards: at most P-r activations held.  Narayanan et al. 2021 (PipeDream-Flush)
    ZB-H1        V = 1.  1F1B's order with B and W apart: rank r runs its first r W's late, one after each later
                 B, and the rest at the end, where 1F1B's ranks wait for gradients.  Qi et al. 2023; torch's
                 ``ScheduleInterleavedZeroBubble`` with one stage per rank builds the same lists
    interleaved  V >= 2 chunks a rank, chunk c of rank r stage c P + r (Megatron's, torch's
    -1F1B        ``ScheduleInterleaved1F1B``).  Micro-batches go in rounds of R = M / max(1, M // P): a rank's k-th
                 forward is on chunk (k // R) mod V, its k-th backward on chunk V-1 - (k // R) mod V, each
                 chunk's micro-batches in order; (V-1) R + 2 (P-1-r) warm-up forwards, then one F and one whole
                 backward in turn.  Narayanan et al. 2021
    ZB-V         V = 2 chunks a rank in a V: rank r holds stage r and stage 2P-1-r, so the activations run down
                 the ranks and back up, and the first and last stages (the tied table's two copies) share rank
                 0.  2(P-r)-1 forwards of chunk 0, r pairs (F chunk 1, F chunk 0), P-r triples (F, B, W) of
                 chunk 1, then F0 B0 W0 F1 B1 W1 in turn; the cool-down runs the B's first and the held-back W's
                 last.  Qi et al. 2023, section 6; torch's ``ScheduleZBVZeroBubble`` builds the same lists

Each stage's W's run in the order of its B's (micro-batch order), so the gradients add into .grad in the same
order under every schedule.  ``timeline`` runs the lists on a clock where F, B and W each take one unit (the
zero-bubble paper's model; one unit is a chunk's pass, so with V chunks a rank's step is 3 V M units) and every
action waits for what it needs; the bubble is the idle share of the time.  Formulas with those costs: GPipe and
1F1B (P-1) / (M+P-1); ZB-H1 (P-1) / (3M+P-1) for M >= P, a third of it or less; interleaved 1F1B (P-1) /
(V M + P-1) for M >= P: 1F1B's 3 (P-1) idle units, each 1/V of a stage's pass; ZB-V (P-1) / (6M + P-1) for
M >= 2P-1: rank r idles r units before its first forward and P-1-r after its last pass, each half a stage's,
half ZB-H1's bubble.
"""

from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "zb-v")
COMPUTE = ("F", "B", "W")
SPLIT = ("zb-h1", "zb-v")  # dx leaves a stage after its B; the others send it after the whole backward (B, W)

Action = tuple[str, int, int]  # (op, micro-batch, stage)


def chunks_per_rank(schedule: str, virtual_stages: int = 1) -> int:
    """V: the stages a rank holds (``virtual_stages`` for interleaved 1F1B, two for ZB-V, else one)."""
    return {"interleaved-1f1b": virtual_stages, "zb-v": 2}.get(schedule, 1)


def stage_of(schedule: str, rank: int, chunk: int, ranks: int) -> int:
    """The stage that chunk ``chunk`` of ``rank`` is: c P + r (looped), or r and 2P-1-r (ZB-V's V)."""
    if schedule == "zb-v":
        return rank if chunk == 0 else 2 * ranks - 1 - rank
    return chunk * ranks + rank


def rank_of(schedule: str, stage: int, ranks: int) -> int:
    """The rank that holds ``stage``: ``stage_of``'s inverse."""
    if schedule == "zb-v":
        return stage if stage < ranks else 2 * ranks - 1 - stage
    return stage % ranks


def check_schedule(schedule: str, ranks: int, micro_batches: int, virtual_stages: int = 1) -> None:
    """Refuse, in one line naming the values, a schedule that cannot run with these counts."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    if schedule == "interleaved-1f1b":
        if virtual_stages < 2:
            raise ValueError(
                f"--schedule interleaved-1f1b needs --virtual-stages V >= 2 chunks a rank, not {virtual_stages} "
                f"(one chunk a rank is --schedule 1f1b)"
            )
        rounds = max(1, micro_batches // ranks)
        if micro_batches % rounds:
            raise ValueError(
                f"--schedule interleaved-1f1b: --micro-batches {micro_batches} does not divide into "
                f"{rounds} equal rounds of micro-batches (M // P with P = {ranks}); use a multiple of {ranks}"
            )
    elif virtual_stages not in (1, chunks_per_rank(schedule)):
        raise ValueError(
            f"--virtual-stages {virtual_stages} applies to --schedule interleaved-1f1b; {schedule} runs "
            f"{chunks_per_rank(schedule)} chunk(s) a rank"
        )


def compute_order(schedule: str, rank: int, ranks: int, micro_batches: int, virtual_stages: int = 1) -> list[Action]:
    """The F, B and W actions of one rank, in the order it runs them."""
    check_schedule(schedule, ranks, micro_batches, virtual_stages)
    if schedule == "interleaved-1f1b":
        return _interleaved(rank, ranks, micro_batches, virtual_stages)
    if schedule == "zb-v":
        return _zb_v(rank, ranks, micro_batches)
    m, r, p = micro_batches, rank, ranks
    if schedule == "gpipe":
        return [("F", i, r) for i in range(m)] + [a for i in range(m) for a in (("B", i, r), ("W", i, r))]
    warmup = min(p - 1 - r, m)
    ops = [("F", i, r) for i in range(warmup)]
    backwards, weights = 0, 0

    def backward():
        nonlocal backwards, weights
        ops.append(("B", backwards, r))
        if schedule == "1f1b":
            ops.append(("W", backwards, r))
            weights += 1
        elif backwards >= r:  # ZB-H1: rank r holds back its first r W's
            ops.append(("W", weights, r))
            weights += 1
        backwards += 1

    for i in range(warmup, m):  # steady state: one forward, one backward
        ops.append(("F", i, r))
        backward()
    while backwards < m:  # cool-down: the remaining backwards
        backward()
    ops.extend(("W", i, r) for i in range(weights, m))  # ZB-H1: the held-back W's fill the end
    return ops


def _interleaved(r: int, p: int, m: int, v: int) -> list[Action]:
    """Interleaved 1F1B on rank r: the k-th forward's and backward's chunk cycle every R micro-batches."""
    per_round = m // max(1, m // p)  # R
    total = m * v  # forwards (and backwards) on this rank
    warmup = min((v - 1) * per_round + 2 * (p - 1 - r), total)
    next_mb = {("F", c): 0 for c in range(v)} | {("B", c): 0 for c in range(v)}
    ops: list[Action] = []

    def run(op: str, chunk: int) -> None:
        i = next_mb[op, chunk]
        next_mb[op, chunk] += 1
        stage = chunk * p + r
        ops.extend([(op, i, stage)] if op == "F" else [("B", i, stage), ("W", i, stage)])

    for k in range(total):
        run("F", (k // per_round) % v)
        if k >= warmup:  # steady state: each forward followed by a backward
            run("B", v - 1 - ((k - warmup) // per_round) % v)
    for k in range(total - warmup, total):  # cool-down: the remaining backwards
        run("B", v - 1 - (k // per_round) % v)
    return ops


def _zb_v(r: int, p: int, m: int) -> list[Action]:
    """ZB-V on rank r, chunk 0 stage r and chunk 1 stage 2P-1-r.  Built for max(M, 2P-1) micro-batches (enough to
    fill the V) and the ones beyond M left out."""
    n = max(m, 2 * p - 1)
    stage = (r, 2 * p - 1 - r)
    count = {(op, c): 0 for op in COMPUTE for c in (0, 1)}
    ops: list[Action] = []

    def run(*steps: tuple[str, int]) -> None:
        for op, c in steps:
            ops.append((op, count[op, c], stage[c]))
            count[op, c] += 1

    for _ in range(2 * (p - r) - 1):  # warm-up: chunk 0's forwards fill the way down
        run(("F", 0))
    for _ in range(r):
        run(("F", 1), ("F", 0))
    for _ in range(p - r):  # the V's bottom: chunk 1's first backwards
        run(("F", 1), ("B", 1), ("W", 1))
    while count["F", 1] < count["F", 0] or count["F", 0] < n:  # steady state
        if count["F", 0] < n:
            run(("F", 0))
        run(("B", 0), ("W", 0), ("F", 1), ("B", 1), ("W", 1))
    w0, w1 = count["B", 0], count["B", 1]  # the W's held back from here
    for _ in range(r):  # cool-down: the B's first (they free the ranks above), the W's fill the end
        run(("B", 0), ("B", 1))
    for _ in range(p - r):
        run(("B", 0))
        ops.append(("W", w0, stage[0]))
        w0 += 1
    ops += [("W", i, stage[1]) for i in range(w1, count["B", 1])]
    ops += [("W", i, stage[0]) for i in range(w0, count["B", 0])]
    return [a for a in ops if a[1] < m]


def actions(schedule: str, rank: int, ranks: int, micro_batches: int, virtual_stages: int = 1) -> list[Action]:
    """``compute_order`` with the sends and receives it needs: what the runtime executes.  A stage whose neighbour
    sits on the same rank (ZB-V's bottom) hands its tensor over in memory, with no send or receive."""
    last = ranks * chunks_per_rank(schedule, virtual_stages) - 1
    split = schedule in SPLIT

    def away(stage: int) -> bool:  # a stage on another rank than this one
        return 0 <= stage <= last and rank_of(schedule, stage, ranks) != rank

    out: list[Action] = []
    for op, i, s in compute_order(schedule, rank, ranks, micro_batches, virtual_stages):
        if op == "F":
            out += [("recv_act", i, s)] * away(s - 1) + [("F", i, s)] + [("send_act", i, s)] * away(s + 1)
        elif op == "B":
            out += [("recv_grad", i, s)] * away(s + 1) + [("B", i, s)]
        else:
            out.append((op, i, s))
        if away(s - 1) and (op, split) in (("B", True), ("W", False)):
            out.append(("send_grad", i, s))
    return out


def timeline(
    schedule: str, ranks: int, micro_batches: int, virtual_stages: int = 1
) -> list[list[tuple[int, str, int, int]]]:
    """Per rank, ``(start time, op, micro_batch, stage)`` of each F, B and W, each one unit long, each started as
    soon as its rank is free and its input is there (F after the previous stage's F, B after the next stage's B
    (its whole backward, B and W, if the schedule does not split them) or, on the last stage, after its own F)."""
    orders = [compute_order(schedule, r, ranks, micro_batches, virtual_stages) for r in range(ranks)]
    last = ranks * chunks_per_rank(schedule, virtual_stages) - 1
    sent = "B" if schedule in SPLIT else "W"
    done: dict[tuple[int, str, int], int] = {}  # (stage, op, micro-batch) -> end time
    pos, free = [0] * ranks, [0] * ranks
    out: list[list[tuple[int, str, int, int]]] = [[] for _ in range(ranks)]
    while any(pos[r] < len(orders[r]) for r in range(ranks)):
        moved = False
        for r in range(ranks):
            if pos[r] == len(orders[r]):
                continue
            op, i, s = orders[r][pos[r]]
            need = {
                "F": (s - 1, "F", i) if s > 0 else None,
                "B": (s + 1, sent, i) if s < last else (s, "F", i),
                "W": (s, "B", i),
            }[op]
            if need is not None and need not in done:
                continue
            start = max(free[r], done[need] if need is not None else 0)
            done[(s, op, i)] = free[r] = start + 1
            out[r].append((start, op, i, s))
            pos[r] += 1
            moved = True
        if not moved:
            raise RuntimeError(
                f"schedule {schedule!r} deadlocks with {ranks} ranks, {micro_batches} micro-batches and "
                f"{virtual_stages} virtual stages"
            )
    return out


def bubble(schedule: str, ranks: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """The idle share of the pipeline's time on the unit-cost timeline: idle slots / (ranks x makespan)."""
    line = timeline(schedule, ranks, micro_batches, virtual_stages)
    span = max(t for row in line for t, *_ in row) + 1
    return 1.0 - sum(len(row) for row in line) / (ranks * span)


def bubble_formula(schedule: str, ranks: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """The bubble on the unit-cost clock (see the module), for the counts each formula assumes."""
    p, m = ranks, micro_batches
    units = {"zb-h1": 3 * m, "interleaved-1f1b": virtual_stages * m, "zb-v": 6 * m}.get(schedule, m)
    return (p - 1) / (units + p - 1)


def render(schedule: str, ranks: int, micro_batches: int, virtual_stages: int = 1) -> str:
    """The timeline as text, one row per rank, one cell per time unit ('F0 ', 'B0 ', 'W0 ', ' . '); with several
    chunks a rank, the chunk's letter after the micro-batch ('F0a': chunk 0, 'F0b': chunk 1)."""
    line = timeline(schedule, ranks, micro_batches, virtual_stages)
    v = chunks_per_rank(schedule, virtual_stages)
    span = max(t for row in line for t, *_ in row) + 1
    width = len(f"F{micro_batches - 1}") + (v > 1) + 1
    rows = []
    for r, row in enumerate(line):
        chunk = {stage_of(schedule, r, c, ranks): "abcdefghijklmnopqrstuvwxyz"[c] for c in range(v)}
        cells = [" . ".ljust(width)] * span
        for t, op, i, s in row:
            cells[t] = (f"{op}{i}" + chunk[s] * (v > 1)).ljust(width)
        rows.append(f"rank {r} |" + "".join(cells) + "|")
    measured = bubble(schedule, ranks, micro_batches, virtual_stages)
    chunks = f" x {v} chunks a rank" * (v > 1)
    rows.append(
        f"{schedule}: {ranks} ranks{chunks}, {micro_batches} micro-batches, F = B = W = 1 unit: bubble "
        f"{measured:.3f} (formula {bubble_formula(schedule, ranks, micro_batches, virtual_stages):.3f})"
    )
    return "\n".join(rows)
