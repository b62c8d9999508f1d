"""ZeRO stages 1 and 2 by hand on the data-parallel gradient buckets: each rank keeps the optimizer state of one
shard of every bucket, and steps only that shard.

Rajbhandari et al. 2020 (ZeRO); the order is llm.c's (``train_gpt2.cu``, ``multi_gpu_async_reduce_gradient``, then
the sharded AdamW, then ``multi_gpu_gather``) and Megatron's distributed optimizer's:

    1. reduce-scatter each full gradient bucket (padded to a multiple of the world size W): rank r receives the sum
       over ranks of shard r only, as soon as the bucket is full, overlapping the rest of the backward; x scale
    2. step the optimizer on shard r: its "parameters" are the pieces of the model's parameters that fall in the
       shard (1-D views into a flat copy of the parameters laid out as the bucket), their .grad the reduced shard
    3. all-gather the parameter shards: every rank holds every updated parameter again

Stage 1 shards the optimizer state (1/W of Adam's two moments a rank); the full gradient buckets stay allocated
between steps (after the step they hold this rank's own, unreduced gradients; the reduced ones are the shard's).
Stage 2 also shards the gradients: a bucket's full buffer is dropped once it is reduce-scattered (and the model's
``.grad`` set to None), so between steps a rank holds only its gradient shard; the next backward allocates them
again.  ``step(max_norm)`` clips the averaged gradients by their total norm first, as ``optimizers.clip_grad_norm_``
does, from the shards.  Every optimizer of ``optimizers`` works unchanged: their updates are element-wise, so a
shard's pieces step exactly as the whole tensors would.  ``state_dict()`` is this rank's shard of the optimizer
state, with the layout it belongs to; ``load_state_dict`` refuses a shard of another rank, world size or bucket
layout.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor

from .allreduce import GradBuckets, _Bucket, _is_transposed


class _ShardedBuckets(GradBuckets):
    """GradBuckets whose full bucket is reduce-scattered (into ``b.shard``) instead of all-reduced."""

    def _launch(self, b: _Bucket):
        return dist.reduce_scatter_single(b.shard, b.buffer, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def _reduced(self, b: _Bucket) -> Tensor:
        return b.shard


class ZeroOptimizer:
    """``ZeroOptimizer(optimizer_class, params_or_groups, stage=1, group=None, bucket_cap_mb=25, **defaults)``.

    ``params_or_groups``: the model's parameters, or torch.optim-style groups (dicts with "params" and their own
    hyper-parameters), the same on every rank.  Per step: ``zero_grad()``, the backward (gradients reach the
    buckets through ``ready(params)`` after each layer, or all at once in ``step``), ``step()``.  The gradients are
    averaged (sum x 1/W), as data parallelism's are."""

    def __init__(
        self,
        optimizer_class,
        params_or_groups,
        stage: int = 1,
        group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float = 25.0,
        **defaults,
    ) -> None:
        if stage not in (1, 2):
            raise ValueError(f"ZeroOptimizer: stage must be 1 or 2, got {stage!r}")
        groups = list(params_or_groups)
        if not groups or not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        groups = [dict(g, params=list(g["params"])) for g in groups]
        params = [p for g in groups for p in g["params"]]
        self.stage, self.group = stage, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.buckets = _ShardedBuckets(params, 1.0 / self.world, bucket_cap_mb, group, pad_to=self.world)
        group_of = {id(p): i for i, g in enumerate(groups) for p in g["params"]}
        pieces: list[list[Tensor]] = [[] for _ in groups]
        self._owner: list[tuple[Tensor, Tensor]] = []  # (this rank's piece of a parameter, the parameter)
        for b in self.buckets.buckets:
            n = b.buffer.numel() // self.world
            lo, hi = self.rank * n, (self.rank + 1) * n  # this rank's shard of the bucket
            b.lo, b.hi = lo, hi
            b.shard = b.buffer.new_zeros(n)  # the reduced gradient of the shard
            b.params_flat = b.buffer.new_zeros(b.buffer.numel())  # the parameters, laid out as the gradients
            offset = 0
            for p in b.params:
                flat = b.params_flat[offset : offset + p.numel()]
                view = flat.view(p.t().shape).t() if _is_transposed(p) else flat.view(p.shape)
                view.copy_(p.detach())
                p.data = view  # the model's parameter now lives in the flat copy (its identity kept)
                a, c = max(offset, lo), min(offset + p.numel(), hi)
                if a < c:  # the part of p in this rank's shard: a 1-D view, stepped in place
                    piece = b.params_flat[a:c]
                    piece.grad = b.shard[a - lo : c - lo]
                    pieces[group_of[id(p)]].append(piece)
                    self._owner.append((piece, p))
                offset += p.numel()
        kept = [dict(g, params=ps) for g, ps in zip(groups, pieces, strict=True) if ps]
        if not kept:
            raise ValueError(
                f"ZeroOptimizer: rank {self.rank} of {self.world} holds no parameter: the model is too "
                f"small to shard over {self.world} ranks"
            )
        self.optimizer = optimizer_class(kept, **defaults)
        self.params = params
        self._layout = [(len(b.params), b.buffer.numel(), b.lo, b.hi) for b in self.buckets.buckets]

    def ready(self, params: Iterable[Tensor]) -> None:
        """These parameters' gradients are final: into their bucket, whose reduce-scatter starts when it is full."""
        self.buckets.ready(params)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        if self.stage == 2:  # the full buckets were dropped after the last step: allocate them for this backward
            for b in self.buckets.buckets:
                if b.buffer is None:
                    shard, params_flat, lo, hi = b.shard, b.params_flat, b.lo, b.hi
                    b.__init__(b.params, self.world)
                    b.shard, b.params_flat, b.lo, b.hi = shard, params_flat, lo, hi

    @torch.no_grad()
    def step(
        self,
        max_norm: float | None = None,
        norm_weight: dict | None = None,
        norm_group: dist.ProcessGroup | None = None,
    ) -> Tensor | None:
        """The step; with ``max_norm``, the averaged gradients are first clipped to that total 2-norm (the norm of
        all of them, from each rank's shard: its sum of squares all-reduced), and the norm before clipping returned.

        ``norm_weight`` (id(parameter) -> weight) and ``norm_group`` (None: the whole world) are for a model split
        further, whose norm takes the squares of every rank of ``norm_group``: a parameter that other model-parallel
        ranks hold copies of is counted once by weighting its squares 1 / copies."""
        self.buckets.finish()  # 1. the reduce-scatters, x 1/W
        total = None
        if max_norm is not None and norm_weight is not None:
            squares = sum(
                # a piece's gradient is its view of the bucket's shard, set in __init__
                (norm_weight[id(p)] * cast(Tensor, piece.grad).square().sum() for piece, p in self._owner),
                torch.zeros((), dtype=self._owner[0][0].dtype),
            )
            dist.all_reduce(squares, group=norm_group)
        elif max_norm is not None:
            squares = torch.stack([b.shard.square().sum() for b in self.buckets.buckets]).sum()
            dist.all_reduce(squares, group=self.group)
        if max_norm is not None:  # clip_grad_norm_'s rule, g *= min(1, max_norm / (total + 1e-6)), over the shards
            total = squares.sqrt()
            coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
            for b in self.buckets.buckets:
                b.shard.mul_(coef)
        self.optimizer.step()  # 2. this rank's shard
        for b in self.buckets.buckets:  # 3. every rank's shard of the parameters, to every rank
            dist.all_gather_single(b.params_flat, b.params_flat[b.lo : b.hi].clone(), group=self.group)
        if self.stage == 2:  # only the gradient shard outlives the step
            for b in self.buckets.buckets:
                for p in b.params:
                    p.grad = None
                b.buffer, b.slots = None, {}  # type: ignore[assignment]  # remade by zero_grad before any use
        return total

    def state_dict(self) -> dict:
        """This rank's shard of the optimizer state and the layout it belongs to."""
        return {
            "zero_stage": self.stage,
            "rank": self.rank,
            "world_size": self.world,
            "layout": self._layout,
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        mine = {"rank": self.rank, "world_size": self.world, "layout": self._layout}
        for key, want in mine.items():
            got = state.get(key)
            if (list(map(tuple, got)) if key == "layout" and got is not None else got) != want:
                raise ValueError(
                    f"ZeroOptimizer.load_state_dict: the shard was saved with {key} {got!r}, this is "
                    f"{want!r}: resume each rank's own shard with the same world size and model"
                )
        self.optimizer.load_state_dict(state["optimizer"])
