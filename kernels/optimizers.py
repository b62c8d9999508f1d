"""Optimizers' kernels: many tensors that lie side by side in one block of memory, updated as one.

An element-wise update (Adam's, the gradient clip's scaling) does the same arithmetic on every element of every
parameter.  When the parameters are views that tile one contiguous block -- as llm.c keeps all of GPT-2's
weights in one ``params_memory`` and the gradients in one ``grads_memory``; ``models.GPT`` lays its parameters
out so -- one kernel over the block does what one kernel per tensor does, with the same numbers, and the
per-tensor overhead (52 tensors in the default GPT, so 52 small kernels per foreach call) goes.

``flat_views(params, grads, ...)`` returns one 1-D view per list, each over the whole block, or None when the
tensors do not line up exactly: each list must tile one span of one storage, every tensor dense, and the i-th
tensor of each list must sit where the i-th parameter sits (same shape, strides, dtype and offset from the
span's start), so that element k of one view pairs with element k of every other.  Anything else -- a gradient
replaced by ``zero_grad(set_to_none=True)``, a state loaded from a checkpoint, a parameter moved by ``.to()``
-- gives None and the caller takes its per-tensor path: the layout only ever decides the speed, never the
numbers.  With the kernels off (``HANDGRAD_KERNELS=off``, ``kernels.disabled()``) it always gives None: the
optimizers then update tensor by tensor, their textbook.  ``tile_like(params, tensors)`` copies tensors into one
new block laid out like the parameters' (the optimizer's state, on its first step or after a load).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import enabled


def _dense(t: Tensor) -> bool:
    """t covers exactly numel() consecutive elements (contiguous, or a transposed contiguous block, ...)."""
    if t.is_contiguous():
        return True
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride(), strict=True), key=lambda s: s[1]):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _span(params: list[Tensor]) -> tuple[int | torch.SymInt, int | torch.SymInt] | None:
    """(start, end) offsets of the storage span the parameters tile, in any order, or None."""
    p0 = params[0]
    ptr = p0.data_ptr() - p0.storage_offset() * p0.element_size()  # the storage's first byte
    offsets = []
    for p in params:
        if p.data_ptr() - p.storage_offset() * p.element_size() != ptr or p.dtype != p0.dtype or not _dense(p):
            return None
        offsets.append((p.storage_offset(), p.numel()))
    offsets.sort()
    start = end = offsets[0][0]
    for off, n in offsets:
        if off != end:
            return None
        end += n
    return start, end


def flat_views(params: list[Tensor], *others: list[Tensor]) -> list[Tensor] | None:
    """[params' block, each other list's block] as 1-D views that pair element by element, or None."""
    if len(params) < 2 or torch.compiler.is_compiling() or not enabled():
        return None  # nothing to gain (compiled: the compiler fuses the per-tensor kernels itself, without addresses)
    span = _span(params)
    if span is None:
        return None
    start, end = span
    views = [params[0].as_strided((end - start,), (1,), start)]
    for tensors in others:
        if len(tensors) != len(params):
            return None
        t0 = tensors[0]
        base = t0.storage_offset() - (params[0].storage_offset() - start)  # where its block starts
        ptr = t0.data_ptr() - t0.storage_offset() * t0.element_size()
        for p, t in zip(params, tensors, strict=True):
            if (
                t.data_ptr() - t.storage_offset() * t.element_size() != ptr
                or t.dtype != p.dtype
                or t.shape != p.shape
                or t.stride() != p.stride()
                or t.storage_offset() - base != p.storage_offset() - start
            ):
                return None
        if base < 0:
            return None
        views.append(tensors[0].as_strided((end - start,), (1,), base))
    return views


def tile_like(params: list[Tensor], tensors: list[Tensor]) -> list[Tensor] | None:
    """Copies of ``tensors`` (each shaped like its parameter) in one new block laid out as the parameters' span,
    or None when the parameters tile no span."""
    span = _span(params) if len(params) >= 2 and enabled() else None
    if span is None:
        return None
    start, end = span
    block = tensors[0].new_empty(end - start)
    out = []
    for p, t in zip(params, tensors, strict=True):
        view = block.as_strided(p.shape, p.stride(), p.storage_offset() - start)
        view.copy_(t)
        out.append(view)
    return out
