"""The runtime that executes a pipeline schedule's action list on one stage, and the trace it leaves.

``run_schedule(stage, schedule, inputs, targets, act_shape, group)`` walks ``pipeline_schedules.actions`` for this
rank's stage, one action at a time: "F" runs a fresh copy of the stage (``pipeline_gpt.replicate``) on the
micro-batch, the last stage computing the micro-batch's loss (``stage.loss()``); "B" runs that copy's
``backward_input`` on the gradient (on the last stage the loss's, times 1/M: the step's loss is the mean over the M
equal micro-batches); "W" its ``backward_weight``; sends are ``isend`` (waited for at the end), receives are blocking
``recv``, so a stage waits exactly where the schedule says it depends on another.  Every stage runs its W's in the order
of its B's, so the gradients add into .grad in micro-batch order whatever the schedule.  Returns the micro-batches'
losses (on the last stage; empty elsewhere) and the trace: (op, micro-batch, start, end) in seconds, for
``format_trace``.
"""

from __future__ import annotations

import time
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor

from .pipeline_gpt import replicate
from .pipeline_schedules import actions


def run_schedule(
    stage,
    schedule: str,
    inputs: list[Tensor] | None,
    targets: list[Tensor] | None,
    act_shape: tuple[int, ...],
    group: dist.ProcessGroup | None = None,
) -> tuple[list[float], list]:
    """One step's forwards and backwards of ``stage`` (a ``GPTStage`` or a ``TensorParallelStage``) over M
    micro-batches, exchanging activations of ``act_shape`` with the neighbouring ranks of ``group``; see the
    module."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))  # noqa: E731
    xs, ys = cast(list[Tensor], inputs), cast(list[Tensor], targets)  # given to the stage that reads them
    m = len(xs) if stage.first else len(ys)
    dtype = stage.parameters()[0].dtype
    copies, received, crits, losses, sends, trace = {}, {}, {}, {}, [], []
    outputs: dict[tuple[str, int], Any] = {}  # what a send takes (a tensor), the last stage's logits' shape
    for op, i in actions(schedule, rank, size, m):
        start = time.perf_counter()
        if op == "recv_act" or op == "recv_grad":
            buf = torch.empty(act_shape, dtype=dtype)
            dist.recv(buf, src=peer(rank - 1 if op == "recv_act" else rank + 1), group=group)
            received[op, i] = buf
        elif op == "send_act" or op == "send_grad":
            sends.append(
                dist.isend(
                    outputs.pop((op, i)).contiguous(), dst=peer(rank + 1 if op == "send_act" else rank - 1), group=group
                )
            )
        elif op == "F":
            copies[i] = replicate(stage)
            out = copies[i].forward(xs[i] if stage.first else received.pop(("recv_act", i)))
            if stage.last:
                crits[i] = stage.loss()  # the stage's criterion (vocabulary-parallel on a tensor-parallel stage)
                losses[i] = float(crits[i](out.reshape(-1, out.shape[-1]), ys[i].reshape(-1)))
                outputs["logits", i] = out.shape
            else:
                outputs["send_act", i] = out
        elif op == "B":
            if stage.last:
                dout = crits.pop(i).backward(1.0 / m).view(outputs.pop(("logits", i)))
            else:
                dout = received.pop(("recv_grad", i))
            dx = copies[i].backward_input(dout)
            if not stage.first:
                outputs["send_grad", i] = dx
        elif op == "W":
            copies.pop(i).backward_weight()
        else:
            raise ValueError(f"pipeline runtime: unknown action {op!r}")
        trace.append((op, i, start, time.perf_counter()))
    for work in sends:
        cast(dist.Work, work).wait()  # a send within the group: never None
    return [losses[i] for i in sorted(losses)], trace


def format_trace(rank: int, trace: list) -> str:
    """One rank's executed actions in order, with their start and length in ms from the step's start."""
    t0 = trace[0][2] if trace else 0.0
    cells = [f"{op}{i}@{(s - t0) * 1e3:.1f}+{(e - s) * 1e3:.1f}" for op, i, s, e in trace]
    return f"rank {rank}: " + " ".join(cells)
