"""Where a rank sits when tensor, context, pipeline and data parallelism share the world: its coordinates and process
groups.

world = D x P x C x T ranks in Megatron's order, tensor-parallel ranks adjacent, then the context-parallel ranks,
then the pipeline stages, then the data-parallel copies (the group that talks at every layer is the closest, the
one that talks once a step the farthest), so rank = ((d * P + p) * C + c) * T + t:

    tensor-parallel group of rank r:   the T ranks with its (d, p, c)   (split each layer; same data, same stage)
    context-parallel group of rank r:  the C ranks with its (d, p, t)   (split the sequence; the attention's ring)
    pipeline group of rank r:          the P ranks with its (d, c, t)   (the stages; sends and receives between them)
    data-parallel group of rank r:     the D ranks with its (p, c, t)   (the same shards; split the batch)
    gradient group of rank r:          the D x C ranks with its (p, t)  (the same weights: the gradients averaged)
    tied-table group of rank r:        stage 0 and stage P-1 with its (d, c, t)   (the token table's two copies)

A model's copy is the T x C x P ranks of one d.  With C = 1 and P = 1 this is T x D (rank = d * T + t), with T = 1
and C = 1 it is P x D (rank = d * P + p).  Every rank must create every group, in the same order
(torch.distributed's rule for ``new_group``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch.distributed as dist


@dataclass(frozen=True)
class ParallelLayout:
    """This rank's coordinates (tensor-parallel rank t, context-parallel rank c, pipeline stage p, data-parallel rank
    d) and its groups."""

    tp: int
    dp: int
    tp_rank: int
    dp_rank: int
    tp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup
    pp: int = 1
    pp_rank: int = 0
    pp_group: dist.ProcessGroup | None = None
    tie_group: dist.ProcessGroup | None = None  # stage 0 and stage P-1 of this (d, c, t); None when P = 1
    cp: int = 1
    cp_rank: int = 0
    cp_group: dist.ProcessGroup | None = None  # None when C = 1
    grad_group: dist.ProcessGroup | None = None  # the D x C ranks of this (p, t); the data-parallel group when C = 1


def rank_of(d: int, p: int, t: int, pipeline_parallel: int, tensor_parallel: int, c: int = 0, context: int = 1) -> int:
    """The global rank of coordinates (d, p, c, t): ((d * P + p) * C + c) * T + t."""
    return ((d * pipeline_parallel + p) * context + c) * tensor_parallel + t


def _new_group(ranks: list[int]) -> dist.ProcessGroup:
    """dist.new_group, typed as the groups a rank keeps are: a ProcessGroup (a rank outside ``ranks`` gets
    GroupMember.NON_GROUP_MEMBER, an int, for a group it never looks up)."""
    return cast(dist.ProcessGroup, dist.new_group(ranks))


def parallel_layout(tensor_parallel: int, pipeline_parallel: int = 1, context_parallel: int = 1) -> ParallelLayout:
    """The groups of a world of D x P x C x T ranks (D = world / (T C P)); refuses a split that does not divide the
    world."""
    world, rank = dist.get_world_size(), dist.get_rank()
    T, P, C = tensor_parallel, pipeline_parallel, context_parallel
    if min(T, P, C) < 1 or world % (T * P * C):
        what = " x ".join(
            f"--{name} {n}"
            for name, n in (("tensor-parallel", T), ("context-parallel", C), ("pipeline-parallel", P))
            if n != 1 or name == "tensor-parallel"
        )
        what += f" = {T * C * P}" if " x " in what else ""
        raise ValueError(f"{what} does not divide the world size {world}")
    D = world // (T * P * C)
    d, p, c, t = rank // (T * C * P), rank // (T * C) % P, rank // T % C, rank % T
    at = lambda d_, p_, c_, t_: rank_of(d_, p_, t_, P, T, c_, C)  # noqa: E731
    every = [(i, j, m, k) for i in range(D) for j in range(P) for m in range(C) for k in range(T)]
    # every rank creates every group, in one order: tensor, pipeline, data, tied table, then context and gradient
    tp_groups = {(i, j, m): _new_group([at(i, j, m, k) for k in range(T)]) for i, j, m, _ in every if _ == 0}
    pp_groups = {(i, m, k): _new_group([at(i, j, m, k) for j in range(P)]) for i, j, m, k in every if j == 0}
    dp_groups = {(j, m, k): _new_group([at(i, j, m, k) for i in range(D)]) for i, j, m, k in every if i == 0}
    tie_groups = (
        {(i, m, k): _new_group([at(i, 0, m, k), at(i, P - 1, m, k)]) for i, j, m, k in every if j == 0} if P > 1 else {}
    )
    cp_groups, grad_groups = {}, {}
    if C > 1:
        cp_groups = {(i, j, k): _new_group([at(i, j, m, k) for m in range(C)]) for i, j, m, k in every if m == 0}
        grad_groups = {
            (j, k): _new_group([at(i, j, m, k) for i in range(D) for m in range(C)])
            for i, j, m, k in every
            if i == 0 and m == 0
        }
    return ParallelLayout(
        T,
        D,
        t,
        d,
        tp_groups[d, p, c],
        dp_groups[p, c, t],
        P,
        p,
        pp_groups[d, c, t],
        tie_groups.get((d, c, t)),
        C,
        c,
        cp_groups.get((d, p, t)),
        grad_groups.get((p, t), dp_groups[p, c, t]),
    )
