"""Where a rank sits when tensor parallelism and data parallelism share the world: its process groups.

world = T x D ranks, tensor-parallel ranks adjacent (Megatron's order: the group that talks at every layer is the
closest), so rank = d * T + t:

    tensor-parallel group of rank r: the T ranks d * T .. d * T + T - 1   (split the model; same data)
    data-parallel group of rank r:   the D ranks t, T + t, 2T + t, ...     (same shards; split the batch)

Every rank must create every group, in the same order (torch.distributed's rule for ``new_group``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class ParallelLayout:
    """This rank's coordinates (tensor-parallel rank t, data-parallel rank d) and its two groups."""

    tp: int
    dp: int
    tp_rank: int
    dp_rank: int
    tp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup


def parallel_layout(tensor_parallel: int) -> ParallelLayout:
    """The groups of a world of T x D ranks (D = world / T); refuses a T that does not divide the world."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if tensor_parallel < 1 or world % tensor_parallel:
        raise ValueError(f"--tensor-parallel {tensor_parallel} does not divide the world size {world}")
    t, d = tensor_parallel, world // tensor_parallel
    tp_groups = [dist.new_group(list(range(i * t, (i + 1) * t))) for i in range(d)]
    dp_groups = [dist.new_group(list(range(j, world, t))) for j in range(t)]
    return ParallelLayout(t, d, rank % t, rank // t, tp_groups[rank // t], dp_groups[rank % t])
