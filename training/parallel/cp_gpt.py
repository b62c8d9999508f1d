"""The GPT with its sequence split over a context-parallel group: each rank holds its two zigzag chunks of every
window (ring_attention.py), and every layer but the attention is the one-process model's, run on those positions.

Shape legend as models/gpt.py's; C = the group's size, n = T / 2C.  Rank c's part of a window is the positions
``zigzag_positions(T, c, C)``, (2n,): its tokens and targets are cut out of the batch with them, ``wpe`` is looked
up at them (``PositionsAt``), and each block's attention is a ``RingAttention`` over the group.  The embeddings,
layer norms, MLPs and the output layer act on each position alone: on a rank's 2n positions they compute exactly
what they compute there in one process, and their weight gradients are the rank's positions' share, summed over
the C ranks by the data-parallel reduction (the gradient group, layout.py).

``context_parallel(part, group, seq_len)`` takes the GPT or a ``TensorParallelGPT`` (context x tensor
parallelism: the ring then carries this rank's heads, and the sequence-parallel split, if any, cuts the rank's 2n
positions further): a copy of its layer tree (``pipeline_gpt.replicate``: new layer objects, the same parameter
tensors, so the whole model the trainer evaluates keeps its own attention) with the attention and ``wpe``
replaced.
"""

from __future__ import annotations

import torch
from torch import Tensor

from layers.embedding import Embedding
from layers.layer import _rng_untouched

from .pipeline_gpt import replicate
from .ring_attention import RingAttention, zigzag_positions


class PositionsAt(Embedding):
    """``wpe`` looked up at this rank's positions in the whole window: forward(i) = weight[at[i]] for the rank's
    i-th position (the model asks for positions 0..2n-1 of its part); the backward's scatter-add lands on the rows
    looked up.  The weight is ``wpe``'s own tensor."""

    def __init__(self, wpe: Embedding, at: Tensor) -> None:
        w = wpe.weight
        with _rng_untouched(w.device):
            super().__init__(w.shape[0], w.shape[1], dtype=w.dtype, device=w.device)
        self.weight, self.at = w, at.to(w.device)

    def forward_math(self, idx: Tensor):
        return super().forward_math(self.at[idx])


def context_parallel(part, group, seq_len: int, rank: int, size: int):
    """A copy of ``part`` (a GPT or a TensorParallelGPT) running on rank ``rank``'s zigzag positions of windows of
    ``seq_len`` with ring attention over ``group``; see the module."""
    copy = replicate(part)
    copy.wpe = PositionsAt(part.wpe, zigzag_positions(seq_len, rank, size))
    for block in copy.h:
        block.attn.attention = RingAttention(group, seq_len)
    return copy


def zigzag_part(t: Tensor, rank: int, size: int) -> Tensor:
    """Rank ``rank``'s positions of a batch of windows (B, T) -> (B, T / C)."""
    return t[:, zigzag_positions(t.shape[1], rank, size, t.device)]


def unzigzag(parts: list[Tensor], dim: int = 1) -> Tensor:
    """The C ranks' parts along ``dim``, in rank order, put back in the window's order."""
    size, n = len(parts), parts[0].shape[dim]
    order = torch.cat([zigzag_positions(n * size, r, size) for r in range(size)]).to(parts[0].device)
    whole = torch.cat(parts, dim=dim)
    return torch.empty_like(whole).index_copy_(dim, order, whole)
