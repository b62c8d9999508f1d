"""A pipeline stage whose blocks are tensor-parallel: tensor x pipeline parallelism, Megatron's composition.

Shape legend as models/gpt.py's; b = a micro-batch's rows, P = the pipeline's stages, Tp = the tensor-parallel
group's size, r = this rank in it.  Stage s of P holds blocks s*L/P .. (s+1)*L/P - 1, each a ``tp_gpt.ParallelBlock``
split over the stage's Tp ranks; stage 0 also the vocabulary-parallel token table (rows r*Vp/Tp.. of the padded
table) and the replicated wpe, stage P-1 the replicated ln_f, f, and a copy of the same rows of the token table as
the output layer (``head``: the table is tied, so after the step's backwards the two copies' gradients are summed
between stage 0 and stage P-1 of the same tensor rank, ``tie_gradients``), ending in the vocabulary-parallel loss.

Between stages each tensor rank sends to the same tensor rank of the next stage: the residual stream (b, T, C),
the same on the Tp ranks of a stage, or under sequence parallelism this rank's positions (b, T/Tp, C), so a
stage's Tp ranks send Tp disjoint parts and nothing is sent twice.  The input gradient goes back the same way.
The stage's ranks run the same schedule, so their all-reduces (or all-gathers and reduce-scatters) inside each F,
B and W meet.  ``backward_input`` / ``backward_weight`` are the B and W of ``pipeline_runtime``, shared with
``pipeline_gpt.GPTStage`` through ``pipeline_gpt.PipelineStage``; only the embedding's positions and f are this
stage's own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from layers.embedding import Embedding
from layers.layer import _rng_untouched
from models.gpt import GPT

from .pipeline_gpt import PipelineStage
from .tp_cross_entropy import VocabParallelCrossEntropy
from .tp_gpt import ParallelBlock, TensorParallelGPT, _copy_layernorm, sum_partial_grads
from .tp_layers import VocabParallelEmbedding, shard_of
from .tp_mappings import CopyToTensorParallel, GatherFromSequenceParallel, tp_rank_and_size


def vocab_rows(table: Tensor, rank: int, size: int) -> tuple[int, Tensor]:
    """(this rank's first id, its rows of ``table`` (V, C) padded with zero rows to Vp = size * ceil(V / size))."""
    v, c = table.shape
    per = -(-v // size)
    start = rank * per
    rows = torch.zeros(per, c, dtype=table.dtype, device=table.device)
    n = max(0, min(v - start, per))
    rows[:n] = table.detach()[start : start + n]
    return start, rows


class TensorParallelStage(PipelineStage):
    """``TensorParallelStage(gpt, stage, stages, group, sequence_parallel=False)``: the part of ``gpt`` that pipeline
    stage ``stage`` of ``stages`` runs, split over the tensor-parallel ``group``.

    ``forward``: token ids (b, T) on the first stage, the activation on the others -> the activation, or on the last
    stage this rank's vocabulary columns of the logits (b, T, Vp/Tp).  ``backward_input(dout)`` -> the input's
    gradient (None on the first stage); ``backward_weight()`` adds the weight gradients of the last
    ``backward_input``; ``loss()`` the last stage's vocabulary-parallel criterion."""

    f: Any  # f after ln_f on the last stage, None on the others (as PipelineStage's layers)

    def __init__(self, gpt: GPT, stage: int, stages: int, group, sequence_parallel: bool = False) -> None:
        rank, size = tp_rank_and_size(group)
        for what, n, parts, flag in (
            ("n_head", gpt.n_head, size, "--tensor-parallel"),
            ("n_embd", gpt.n_embd, size, "--tensor-parallel"),
            ("n_layer", gpt.n_layer, stages, "--pipeline-parallel"),
        ):
            if n % parts:
                raise ValueError(f"tensor x pipeline parallelism: {what} {n} does not divide by {flag} {parts}")
        if gpt.dropout:
            raise ValueError(f"tensor x pipeline parallelism: dropout {gpt.dropout} is not supported (use --dropout 0)")
        per = gpt.n_layer // stages
        self.stage, self.stages, self.first, self.last = stage, stages, stage == 0, stage == stages - 1
        self.group, self.rank, self.size, self.sequence_parallel = group, rank, size, sequence_parallel
        self.vocab_size, self.n_embd, self.offset = gpt.vocab_size, gpt.n_embd, stage * per
        self.h = [
            ParallelBlock(b, rank, size, group, sequence_parallel) for b in gpt.h[self.offset : self.offset + per]
        ]
        self.wte = self.wpe = self.ln_f = self.f = self.head = None
        if self.first:
            self.wte = VocabParallelEmbedding(gpt.wte, rank, size, group, sequence_parallel=sequence_parallel)
            w = gpt.wpe.weight
            with _rng_untouched(w.device):
                self.wpe = Embedding(w.shape[0], w.shape[1], dtype=w.dtype, device=w.device)  # replicated
            self.wpe.weight = shard_of(w, w.detach())
        self.start, head_rows = vocab_rows(gpt.wte.weight, rank, size)
        if self.last:
            self.ln_f = _copy_layernorm(gpt.ln_f)
            self.f = GatherFromSequenceParallel(group) if sequence_parallel else CopyToTensorParallel(group)
            if not self.first:  # the output layer: the first stage's rows of the tied table, a copy here
                self.head = shard_of(gpt.wte.weight, head_rows)  # (Vp/Tp, C)
        self._x = self._head_w = None

    def activation_shape(self, rows: int, seq: int) -> tuple[int, int, int]:
        """What one tensor rank sends to the next stage: (b, T, C), or (b, T/Tp, C) under sequence parallelism."""
        return rows, seq // self.size if self.sequence_parallel else seq, self.n_embd

    def loss(self) -> VocabParallelCrossEntropy:
        return VocabParallelCrossEntropy(self.start, self.vocab_size, self.group)

    def _embed(self, idx: Tensor) -> Tensor:
        """Token ids (b, T) -> wte + wpe at the positions this rank holds, (b, T, C) or under sequence parallelism
        (b, T/Tp, C)."""
        _, T = idx.shape
        part = T // self.size if self.sequence_parallel else T  # positions a rank holds between split regions
        lo = self.rank * part if self.sequence_parallel else 0
        return self.wte(idx) + self.wpe(torch.arange(lo, lo + part, device=idx.device))

    def _head_input(self, x: Tensor) -> Tensor:
        """``f`` after ``ln_f``: (b, T, C), gathered along T under sequence parallelism; the logits are then this
        rank's vocabulary columns (b, T, Vp/Tp)."""
        return self.f(x)

    def _head_input_backward(self, dx: Tensor) -> Tensor:
        """Back through ``f``: the vocabulary columns' partial gradients summed over the tensor-parallel group
        (all-reduce, or under sequence parallelism reduce-scatter along T to this rank's positions)."""
        return self.f.backward(dx)

    @torch.no_grad()
    def finish_gradients(self) -> None:
        """Under sequence parallelism: sum over the tensor-parallel group the gradients of the replicated parameters
        that saw only this rank's positions (this stage's layer norms, wpe, row-parallel biases); once, after the
        step's backwards.  Else nothing."""
        if self.sequence_parallel:
            sum_partial_grads(
                ([self.wpe.weight] if self.first else []) + ([self.ln_f.weight, self.ln_f.bias] if self.last else []),
                self.h,
                self.group,
            )

    def full_state_dict(self, grad: bool = False) -> dict[str, Tensor]:
        """This stage's parameters (or gradients) whole, under the GPT's names, the output layer's copy left out
        (collective over the tensor-parallel group)."""
        # TensorParallelGPT's walk over the layers, which reads only what a stage has too (named_children)
        out = TensorParallelGPT.full_state_dict(self, grad)  # type: ignore[arg-type]
        out.pop("head", None)
        return out
