"""A rank's several pipeline stages (its chunks): interleaved 1F1B's V, ZB-V's two.

With V chunks a rank the GPT's n_layer blocks are cut into S = P x V stages of n_layer / S blocks each, and rank r
holds the stages ``pipeline_schedules.stage_of`` names: c P + r for chunk c (interleaved), or r and 2P-1-r (ZB-V).
Each chunk is a stage as with one stage a rank (``pipeline_gpt.GPTStage`` or ``tp_pipeline.TensorParallelStage``
built for stage s of S), so its forward, B and W are the ones the other schedules run.  ``StageChunks`` holds
them under the GPT's names, and sums the tied table's two copies: between rank 0 and rank P-1 when they hold the
first and the last stage (interleaved), on rank 0 alone when it holds both (ZB-V: the V starts and ends there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from layers.layer import BaseLayer

from .pipeline_schedules import chunks_per_rank, stage_of


class StageChunks(BaseLayer):
    """``StageChunks(make, schedule, rank, ranks, virtual_stages)``: rank ``rank``'s chunks, ``make(stage, stages)``
    building each (``stages`` = P x V).  ``chunks`` in chunk order; ``first`` / ``last``: whether the rank holds
    the first / the last stage; parameters named as the GPT's, the last stage's copy of the table as ``head``."""

    _param_names = ("head",)

    def __init__(self, make: Callable[[int, int], Any], schedule: str, rank: int, ranks: int, virtual_stages: int):
        v = chunks_per_rank(schedule, virtual_stages)
        self.stages = ranks * v
        self.chunks = [make(stage_of(schedule, rank, c, ranks), self.stages) for c in range(v)]
        self.first = any(c.first for c in self.chunks)
        self.last = any(c.last for c in self.chunks)
        self.head = next((c.head for c in self.chunks if c.last), None)

    def named_children(self) -> Iterator[tuple[str, BaseLayer]]:
        for chunk in self.chunks:
            yield from chunk.named_children()

    def activation_shape(self, rows: int, seq: int) -> tuple[int, ...]:
        return self.chunks[0].activation_shape(rows, seq)

    @torch.no_grad()
    def tie_gradients(self, group: dist.ProcessGroup | None) -> None:
        """Sum the token table's gradient over its two copies (the first stage's wte, the last stage's head): in
        place on a rank that holds both, else over ``group`` (the ranks holding the first and the last stage)."""
        first = next((c for c in self.chunks if c.first), None)
        if first is not None and self.head is not None:  # both copies here
            w, head = first.wte.weight, self.head
            for t in (w, head):
                if t.grad is None:
                    t.grad = torch.zeros_like(t)
            total = w.grad + head.grad
            w.grad.copy_(total)
            head.grad.copy_(total)
        elif first is not None or self.head is not None:
            next(c for c in self.chunks if c.first or c.last).tie_gradients(group)

    def finish_gradients(self) -> None:
        """Each tensor-parallel chunk's sums over its tensor-parallel group (sequence parallelism)."""
        for chunk in self.chunks:
            chunk.finish_gradients()

    def full_state_dict(self, grad: bool = False) -> dict[str, Tensor]:
        """Every chunk's parameters (or gradients) whole, under the GPT's names (tensor-parallel chunks)."""
        return {name: t for chunk in self.chunks for name, t in chunk.full_state_dict(grad).items()}
