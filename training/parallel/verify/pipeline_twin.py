"""The twin of the hand-written pipeline: the nn.Module GPT cut into the same stages and run by
``torch.distributed.pipelining`` (``PipelineStage`` with ``ScheduleGPipe``, ``Schedule1F1B``, or, with several
stages a rank, ``ScheduleInterleaved1F1B`` and ``ScheduleZBVZeroBubble``), autograd doing every backward.

Stage 0 holds wte, wpe and its blocks, the last stage its blocks, ln_f and a copy of the tied table as ``lm_head``
(nn.Linear), whose gradient is summed with wte's after each step (``tie_gradients``), as the hand-written stages
do.  torch's schedules split the batch into M micro-batches along its first axis and divide the gradients by M
(``scale_grads``), so with a mean loss per micro-batch a step is the mean over the batch.  A rank holds the stages
``pipeline_schedules.stage_of`` gives it, as the hand-written ranks do.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)

from ..pipeline_schedules import chunks_per_rank, stage_of

TWIN_SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved-1f1b": ScheduleInterleaved1F1B,
    "zb-v": ScheduleZBVZeroBubble,
}


class TwinStage(nn.Module):
    """The part of a ``models.PytorchGPT`` that stage ``stage`` of ``stages`` runs."""

    def __init__(self, model: nn.Module, stage: int, stages: int) -> None:
        super().__init__()
        gpt: Any = model  # nanoGPT's PytorchGPT: its config() and its ModuleDict's entries, read by attribute
        cfg = gpt.config()
        per = cfg["n_layer"] // stages
        t = gpt.transformer
        self.stage, self.stages, self.first, self.last = stage, stages, stage == 0, stage == stages - 1
        self.h = nn.ModuleList(t.h[stage * per : (stage + 1) * per])
        if self.first:
            self.wte, self.wpe = t.wte, t.wpe
        if self.last:
            self.ln_f = t.ln_f
            self.lm_head = nn.Linear(cfg["n_embd"], cfg["vocab_size"], bias=False, dtype=t.wte.weight.dtype)
            with torch.no_grad():
                self.lm_head.weight.copy_(t.wte.weight)
            if self.first:  # one stage: the table itself, tied
                self.lm_head.weight = self.wte.weight

    def forward(self, x: Tensor) -> Tensor:
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x


def twin_stages(model: nn.Module, schedule: str, rank: int, ranks: int, virtual_stages: int = 1) -> list[TwinStage]:
    """The stages of ``model`` that rank ``rank`` holds under ``schedule``, in chunk order."""
    v = chunks_per_rank(schedule, virtual_stages)
    return [TwinStage(model, stage_of(schedule, rank, c, ranks), ranks * v) for c in range(v)]


@torch.no_grad()
def tie_gradients(modules: list[TwinStage], group: dist.ProcessGroup | None = None) -> None:
    """Sum the tied table's gradient over the first stage's wte and the last stage's lm_head: in place when one rank
    holds both (ZB-V), else over ``group``."""
    first = next((m for m in modules if m.first), None)
    last = next((m for m in modules if m.last), None)
    if first is not None and last is not None and first is not last:
        w, head = first.wte.weight, last.lm_head.weight
        total = cast(Tensor, w.grad) + cast(Tensor, head.grad)  # both stages ran their backwards
        w.grad, head.grad = total, total.clone()
    elif (first is None) != (last is None):
        w = first.wte.weight if first is not None else cast(TwinStage, last).lm_head.weight
        if w.grad is None:
            w.grad = torch.zeros_like(w)
        dist.all_reduce(w.grad, group=group)


def twin_schedule(modules: list[TwinStage], schedule: str, micro_batches: int, group=None):
    """torch's schedule for this rank's stages, with the mean cross-entropy of each micro-batch as its loss."""
    if schedule not in TWIN_SCHEDULES:
        raise ValueError(f"pipeline twin: torch's pipelining runs {', '.join(TWIN_SCHEDULES)} here, not {schedule!r}")
    pipes = [PipelineStage(m, m.stage, m.stages, torch.device("cpu"), group=group) for m in modules]
    loss = lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))  # noqa: E731
    one = len(pipes) == 1 and schedule in ("gpipe", "1f1b")  # torch's single-stage schedules take one stage
    return TWIN_SCHEDULES[schedule](pipes[0] if one else pipes, n_microbatches=micro_batches, loss_fn=loss)
