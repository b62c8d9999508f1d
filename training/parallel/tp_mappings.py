"""Megatron's conjugate pair f and g, the only communication of tensor parallelism, each with its backward by hand.

Shoeybi et al. 2019 (Megatron-LM, ``tensor_parallel/mappings.py``; picotron's ``tp_communications.py``): a
column-parallel Linear is f, then the local product with this rank's rows of W; a row-parallel Linear is the local
product with this rank's columns of W, then g.

    f  (CopyToTensorParallel)      forward: identity            backward: all-reduce (sum) over the group
    g  (ReduceFromTensorParallel)  forward: all-reduce (sum)    backward: identity

With sequence parallelism (Korthikanti et al. 2022) the activations between the tensor-parallel regions are split
along the sequence, and the pair becomes

    GatherFromSequenceParallel        forward: all-gather along T   backward: reduce-scatter along T
    ReduceScatterToSequenceParallel   forward: reduce-scatter along T   backward: all-gather along T

(an all-reduce is a reduce-scatter then an all-gather: the same bytes, with the layer norms, dropout and residual
adds in between run on 1/P of the positions).

Why: every rank holds the whole input x of a column-parallel layer, and each rank's output slice depends on x
through its own rows only, so dL/dx is the sum of the ranks' partial dx -- f's backward.  A row-parallel layer's
output is the sum of the ranks' partial products -- g's forward -- and each partial product receives the whole
output gradient -- g's backward is the identity.  Each is an object with ``forward`` and ``backward``, as a layer;
the all-reduce writes into the tensor it is given (a fresh product of the layer before it), as Megatron's does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def all_reduce_(t: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """t summed over the group, in t's own memory (made contiguous first if it is not); returns it."""
    if not t.is_contiguous():
        t = t.contiguous()
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


class CopyToTensorParallel:
    """f: identity forward; backward all-reduces dx (the ranks' partial input gradients add up)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group

    def forward(self, x: Tensor) -> Tensor:
        return x

    def backward(self, dout: Tensor) -> Tensor:
        return all_reduce_(dout, self.group)

    __call__ = forward


class ReduceFromTensorParallel:
    """g: forward all-reduces the ranks' partial outputs; backward is the identity (each part gets all of dout)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group

    def forward(self, x: Tensor) -> Tensor:
        return all_reduce_(x, self.group)

    def backward(self, dout: Tensor) -> Tensor:
        return dout

    __call__ = forward


def tp_rank_and_size(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(this process's rank in the tensor-parallel group, the group's size)."""
    return dist.get_rank(group), dist.get_world_size(group)


def shard_rows(t: Tensor, rank: int, size: int) -> Tensor:
    """This rank's contiguous block of t's first axis (its length divisible by size), as a new tensor."""
    n = t.shape[0]
    if n % size:
        raise ValueError(f"tensor parallelism: {n} rows do not divide among {size} ranks")
    return t[rank * (n // size) : (rank + 1) * (n // size)].clone()


def gather_rows(t: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """The ranks' blocks of the first axis, concatenated in rank order (the inverse of ``shard_rows``)."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, 0)


def _seq_first(x: Tensor) -> Tensor:
    """(B, T, C) -> (T, B, C), contiguous: the sequence axis first, so each rank's part is one block of memory."""
    return x.transpose(0, 1).contiguous()


def gather_sequence(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """(B, T/P, C) on each rank -> (B, T, C): the ranks' parts of the sequence in rank order."""
    local = _seq_first(x)  # (T/P, B, C)
    out = local.new_empty(local.shape[0] * dist.get_world_size(group), *local.shape[1:])
    dist.all_gather_single(out, local, group=group)
    return out.transpose(0, 1)  # (B, T, C)


def reduce_scatter_sequence(x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    """(B, T, C) on each rank -> (B, T/P, C): this rank's part of the sequence, summed over the ranks."""
    size = dist.get_world_size(group)
    if x.shape[1] % size:
        raise ValueError(
            f"sequence parallelism: sequence length {x.shape[1]} does not divide by --tensor-parallel {size}"
        )
    full = _seq_first(x)  # (T, B, C)
    out = full.new_empty(full.shape[0] // size, *full.shape[1:])
    dist.reduce_scatter_single(out, full, op=dist.ReduceOp.SUM, group=group)
    return out.transpose(0, 1)  # (B, T/P, C)


class GatherFromSequenceParallel:
    """Sequence parallelism's f: all-gather along T forward; reduce-scatter of dx along T backward."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group

    def forward(self, x: Tensor) -> Tensor:
        return gather_sequence(x, self.group)

    def backward(self, dout: Tensor) -> Tensor:
        return reduce_scatter_sequence(dout, self.group)

    __call__ = forward


class ReduceScatterToSequenceParallel:
    """Sequence parallelism's g: reduce-scatter along T forward; all-gather of dout along T backward."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group

    def forward(self, x: Tensor) -> Tensor:
        return reduce_scatter_sequence(x, self.group)

    def backward(self, dout: Tensor) -> Tensor:
        return gather_sequence(dout, self.group)

    __call__ = forward
