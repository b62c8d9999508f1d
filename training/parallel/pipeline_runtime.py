"""The runtime that executes a pipeline schedule's action list on one rank, and the trace it leaves.

``run_schedule(part, schedule, inputs, targets, act_shape, group)`` walks ``pipeline_schedules.actions`` for this
rank, one action at a time, ``part`` being the rank's stage or, with several stages a rank, its
``pipeline_chunks.StageChunks``: "F" runs a fresh copy of the action's stage (``pipeline_gpt.replicate``) on the
micro-batch, the last stage computing the micro-batch's loss (``stage.loss()``); "B" runs that copy's
``backward_input`` on the gradient (on the last stage the loss's, times 1/M: the step's loss is the mean over the M
equal micro-batches); "W" its ``backward_weight``; sends are ``isend`` (waited for at the end), receives are blocking
``recv``, so a rank waits exactly where the schedule says it depends on another.  Each message is tagged with its
boundary and micro-batch, so two chunks' messages between the same two ranks never meet the wrong receive; a
tensor for a stage on the same rank (ZB-V's bottom) is handed over in memory.  Every stage runs its W's in the
order of its B's, so the gradients add into .grad in micro-batch order whatever the schedule.  Returns the
micro-batches' losses (on the rank holding the last stage; empty elsewhere) and the trace: (op, micro-batch,
stage, start, end), times in seconds, for ``format_trace``.
"""

from __future__ import annotations

import time
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor

from .pipeline_gpt import replicate
from .pipeline_schedules import actions, rank_of


def run_schedule(
    part,
    schedule: str,
    inputs: list[Tensor] | None,
    targets: list[Tensor] | None,
    act_shape: tuple[int, ...],
    group: dist.ProcessGroup | None = None,
) -> tuple[list[float], list]:
    """One step's forwards and backwards of ``part`` (a ``GPTStage``, a ``TensorParallelStage`` or a
    ``StageChunks`` of either) over M micro-batches, exchanging activations of ``act_shape`` with the other ranks of
    ``group``; see the module.  ``inputs`` are read on the first stage, ``targets`` on the last; a rank holding
    neither is given either list, to count M."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))  # noqa: E731
    stages = {c.stage: c for c in getattr(part, "chunks", [part])}
    last = next(iter(stages.values())).stages - 1
    xs, ys = cast(list[Tensor], inputs), cast(list[Tensor], targets)  # given to the rank that reads them
    if inputs is None and targets is None:
        raise ValueError("pipeline runtime: give the micro-batches' inputs or targets (a rank counts them, M)")
    m = len(xs) if xs is not None else len(ys)
    dtype = part.parameters()[0].dtype

    def tag(boundary: int, i: int, grad: bool) -> int:  # the message across stages boundary | boundary + 1
        return 2 * (boundary * m + i) + grad

    def here(stage: int) -> bool:
        return 0 <= stage <= last and rank_of(schedule, stage, size) == rank

    copies, inbox, crits, losses, sends, trace = {}, {}, {}, {}, [], []
    outbox: dict[tuple[str, int, int], Any] = {}  # what a send takes (a tensor), the last stage's logits' shape
    for op, i, s in actions(schedule, rank, size, m, len(stages)):
        start = time.perf_counter()
        stage = stages[s]
        if op == "recv_act" or op == "recv_grad":
            buf = torch.empty(act_shape, dtype=dtype)
            src, boundary = (s - 1, s - 1) if op == "recv_act" else (s + 1, s)
            dist.recv(buf, src=peer(rank_of(schedule, src, size)), group=group, tag=tag(boundary, i, op == "recv_grad"))
            inbox[op[5:], s, i] = buf
        elif op == "send_act" or op == "send_grad":
            dst, boundary = (s + 1, s) if op == "send_act" else (s - 1, s - 1)
            t = outbox.pop((op, s, i)).contiguous()
            sends.append(
                dist.isend(
                    t, dst=peer(rank_of(schedule, dst, size)), group=group, tag=tag(boundary, i, op == "send_grad")
                )
            )
        elif op == "F":
            copies[s, i] = replicate(stage)
            out = copies[s, i].forward(xs[i] if stage.first else inbox.pop(("act", s, i)))
            if stage.last:
                crits[i] = stage.loss()  # the stage's criterion (vocabulary-parallel on a tensor-parallel stage)
                losses[i] = float(crits[i](out.reshape(-1, out.shape[-1]), ys[i].reshape(-1)))
                outbox["logits", s, i] = out.shape
            elif here(s + 1):
                inbox["act", s + 1, i] = out
            else:
                outbox["send_act", s, i] = out
        elif op == "B":
            if stage.last:
                dout = crits.pop(i).backward(1.0 / m).view(outbox.pop(("logits", s, i)))
            else:
                dout = inbox.pop(("grad", s, i))
            dx = copies[s, i].backward_input(dout)
            if here(s - 1):
                inbox["grad", s - 1, i] = dx
            elif not stage.first:
                outbox["send_grad", s, i] = dx
        elif op == "W":
            copies.pop((s, i)).backward_weight()
        else:
            raise ValueError(f"pipeline runtime: unknown action {op!r}")
        trace.append((op, i, s, start, time.perf_counter()))
    for work in sends:
        cast(dist.Work, work).wait()  # a send within the group: never None
    return [losses[i] for i in sorted(losses)], trace


def format_trace(rank: int, trace: list) -> str:
    """One rank's executed actions in order, with their start and length in ms from the step's start; with several
    stages a rank, each action's stage after its micro-batch ('F0s2': micro-batch 0 on stage 2)."""
    t0 = trace[0][3] if trace else 0.0
    several = len({s for _, _, s, _, _ in trace}) > 1
    cells = [f"{op}{i}{f's{s}' * several}@{(b - t0) * 1e3:.1f}+{(e - b) * 1e3:.1f}" for op, i, s, b, e in trace]
    return f"rank {rank}: " + " ".join(cells)
