"""Gradient averaging across processes, written out by hand: flat buckets, each all-reduced as soon as it is full.

What ``torch.nn.parallel.DistributedDataParallel`` does with autograd hooks, done here with the
hand-written backward's own hook (``Sequential.register_backward_hook``):

1. The parameters are split, in reverse order (the order backward produces their gradients), into
   buckets of about ``bucket_cap_mb`` each; each bucket owns one flat buffer.
2. Right after a layer's backward, its parameters' gradients are final for this step: each is copied
   into its slot of the bucket buffer (and ``p.grad`` becomes a view of that slot, so the next
   in-place accumulation writes there directly), and when a bucket's last parameter is in, its
   all-reduce starts *asynchronously* -- communication overlaps the rest of the backward.
3. ``finish()`` waits for every bucket; each gradient then holds the sum over ranks, scaled by
   ``scale`` (1/world_size for a plain average, as DDP).  Every rank builds the same buckets in the
   same order and launches them in the same order, which is what makes the collectives match.

Gloo has no ReduceOp.AVG (it is NCCL-only), so the average is a SUM then a multiply, as torch's own
data-parallel tutorial writes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor


class _Bucket:
    # ZeroOptimizer's (zero.py), set there: this rank's slice [lo, hi) of the buffer, its reduced gradient (shard)
    # and the parameters' values laid out as the buffer (params_flat)
    lo: int
    hi: int
    shard: Tensor
    params_flat: Tensor

    def __init__(self, params: list[Tensor], pad_to: int = 1) -> None:
        self.params = params
        self.numel = sum(p.numel() for p in params)
        # padded with zeros to a multiple of pad_to: a reduce-scatter's equal shards (ZeRO, training/parallel/zero.py)
        self.buffer = torch.zeros(-(-self.numel // pad_to) * pad_to, dtype=params[0].dtype, device=params[0].device)
        self.slots: dict[int, Tensor] = {}  # id(param) -> its view into the buffer, in the parameter's shape
        offset = 0
        for p in params:
            flat = self.buffer[offset : offset + p.numel()]
            # The same strides as the parameter (a transposed block stays one), so .grad matches it.
            self.slots[id(p)] = flat.view(p.t().shape).t() if _is_transposed(p) else flat.view(p.shape)
            offset += p.numel()
        self.done: set[int] = set()  # ids of the parameters reported this step
        self.work: dist.Work | None = None  # the bucket's collective, once launched


def _is_transposed(p: Tensor) -> bool:
    return p.dim() == 2 and p.stride() == (1, p.shape[0]) and p.shape[0] > 1


class GradBuckets:
    """``GradBuckets(params, world_size)``; call ``ready(layer_params)`` after each layer's backward (or let
    ``attach(model)`` do it), then ``finish()`` after the backward.  ``reduce_all()`` does all buckets at once
    (for a model without per-layer hooks, such as the autodiff engine's graph).

    A parameter whose ``requires_grad`` is False is frozen, as torch's DDP leaves it: its ``.grad`` is neither
    reduced nor replaced.  ``flags=False`` for tensors that carry no such flag of their own (the autodiff engine's
    ``.data``, whose engine Tensor holds it): every one is reduced."""

    def __init__(
        self,
        params: Iterable[Tensor],
        scale: float,
        bucket_cap_mb: float = 25.0,
        group: dist.ProcessGroup | None = None,
        pad_to: int = 1,
        *,
        flags: bool = True,
    ) -> None:
        params = [p for p in params]
        if not params:
            raise ValueError("GradBuckets: no parameters")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("GradBuckets: a parameter appears twice")
        self.scale, self.group, self.flags = scale, group, flags
        cap = max(1, int(bucket_cap_mb * 2**20))
        self.buckets: list[_Bucket] = []
        current: list[Tensor] = []
        size = 0
        for p in reversed(params):  # backward produces the last layer's gradients first
            if current and (
                size + p.numel() * p.element_size() > cap
                or p.dtype != current[0].dtype
                or p.device != current[0].device
            ):
                self.buckets.append(_Bucket(current, pad_to))
                current, size = [], 0
            current.append(p)
            size += p.numel() * p.element_size()
        self.buckets.append(_Bucket(current, pad_to))
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._hook_handles: list = []
        self._start_step()

    def __len__(self) -> int:
        return len(self.buckets)

    def _start_step(self) -> None:
        for b in self.buckets:
            b.done.clear()
            b.work = None

    def attach(self, model) -> GradBuckets:
        """Hook into every ``Sequential`` of a hand-written model: each leaf layer's backward ends with ``ready``."""
        from layers import Sequential

        stack = [model]
        while stack:
            node = stack.pop()
            if isinstance(node, Sequential):
                stack.extend(node.layers)
                self._hook_handles.append(node.register_backward_hook(self._on_layer_done))
        return self

    def detach(self) -> None:
        for h in self._hook_handles:
            h.remove()
        self._hook_handles.clear()

    def _on_layer_done(self, layer) -> None:
        from layers import Sequential

        if not isinstance(layer, Sequential):  # a nested container's leaves were reported by its own hook
            self.ready(layer.parameters())

    def ready(self, params: Iterable[Tensor]) -> None:
        """These parameters' gradients are final for this step: copy them into their bucket; launch full buckets."""
        for p in params:
            b = self._bucket_of.get(id(p))
            if b is None or id(p) in b.done:
                continue
            slot = b.slots[id(p)]
            if self.flags and not p.requires_grad:  # frozen: its .grad is its own, neither reduced nor replaced
                if p.grad is not None and p.grad.data_ptr() == slot.data_ptr():
                    p.grad = p.grad.clone()  # out of the bucket, values kept (it was given the slot while trainable)
                slot.zero_()
            elif p.grad is None:
                slot.zero_()  # a parameter that took no part in this step contributes zeros
                p.grad = slot
            else:
                if p.grad.data_ptr() != slot.data_ptr():
                    slot.copy_(p.grad)
                p.grad = slot
            b.done.add(id(p))
            if len(b.done) == len(b.params):
                b.work = self._launch(b)

    def _launch(self, b: _Bucket):
        """Start a full bucket's collective (here its all-reduce; ZeRO's subclass reduce-scatters)."""
        return dist.all_reduce(b.buffer, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def _reduced(self, b: _Bucket) -> Tensor:
        """Where a bucket's collective leaves the sum: the whole buffer (ZeRO's subclass: this rank's shard)."""
        return b.buffer

    def finish(self) -> None:
        """Launch any bucket not yet launched (in bucket order), wait for all, scale; ready for the next step."""
        for b in self.buckets:
            if b.work is None:
                self.ready(b.params)
        for b in self.buckets:
            cast(dist.Work, b.work).wait()  # launched: by the loop above if not before
            if self.scale != 1.0:
                self._reduced(b).mul_(self.scale)
        self._start_step()

    def reduce_all(self) -> None:
        """All buckets after the whole backward (no overlap): for models without per-layer backward hooks."""
        for b in self.buckets:
            self.ready(b.params)
        self.finish()
