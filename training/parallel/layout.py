"""Where a rank sits when tensor, pipeline and data parallelism share the world: its coordinates and process groups.

world = D x P x T ranks in Megatron's order, tensor-parallel ranks adjacent, then the pipeline stages, then the
data-parallel copies (the group that talks at every layer is the closest, the one that talks once a step the
farthest), so rank = (d * P + p) * T + t:

    tensor-parallel group of rank r:  the T ranks with its (d, p)   (split each layer; same data, same stage)
    pipeline group of rank r:         the P ranks with its (d, t)   (the stages; sends and receives between them)
    data-parallel group of rank r:    the D ranks with its (p, t)   (the same shards; split the batch)
    tied-table group of rank r:       stage 0 and stage P-1 with its (d, t)   (the token table's two copies)

A model's copy is the T x P ranks of one d.  With P = 1 this is T x D (rank = d * T + t), with T = 1 it is P x D
(rank = d * P + p).  Every rank must create every group, in the same order (torch.distributed's rule for
``new_group``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class ParallelLayout:
    """This rank's coordinates (tensor-parallel rank t, pipeline stage p, data-parallel rank d) and its groups."""

    tp: int
    dp: int
    tp_rank: int
    dp_rank: int
    tp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup
    pp: int = 1
    pp_rank: int = 0
    pp_group: dist.ProcessGroup | None = None
    tie_group: dist.ProcessGroup | None = None  # stage 0 and stage P-1 of this (d, t); None when P = 1


def rank_of(d: int, p: int, t: int, pipeline_parallel: int, tensor_parallel: int) -> int:
    """The global rank of coordinates (d, p, t): (d * P + p) * T + t."""
    return (d * pipeline_parallel + p) * tensor_parallel + t


def parallel_layout(tensor_parallel: int, pipeline_parallel: int = 1) -> ParallelLayout:
    """The groups of a world of D x P x T ranks (D = world / (T P)); refuses a T x P that does not divide the
    world."""
    world, rank = dist.get_world_size(), dist.get_rank()
    T, P = tensor_parallel, pipeline_parallel
    if T < 1 or P < 1 or world % (T * P):
        what = f"--tensor-parallel {T}" + (f" x --pipeline-parallel {P} = {T * P}" if P != 1 else "")
        raise ValueError(f"{what} does not divide the world size {world}")
    D = world // (T * P)
    d, p, t = rank // (T * P), rank // T % P, rank % T
    at = lambda d_, p_, t_: rank_of(d_, p_, t_, P, T)  # noqa: E731
    # every rank creates every group, in one order: tensor, then pipeline, then data, then the tied table
    tp_groups = {(i, j): dist.new_group([at(i, j, k) for k in range(T)]) for i in range(D) for j in range(P)}
    pp_groups = {(i, k): dist.new_group([at(i, j, k) for j in range(P)]) for i in range(D) for k in range(T)}
    dp_groups = {(j, k): dist.new_group([at(i, j, k) for i in range(D)]) for j in range(P) for k in range(T)}
    tie_groups = (
        {(i, k): dist.new_group([at(i, 0, k), at(i, P - 1, k)]) for i in range(D) for k in range(T)} if P > 1 else {}
    )
    return ParallelLayout(T, D, t, d, tp_groups[d, p], dp_groups[p, t], P, p, pp_groups[d, t], tie_groups.get((d, t)))
