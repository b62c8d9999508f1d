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
B and W meet.  ``backward_input`` / ``backward_weight`` are the B and W of ``pipeline_runtime``; the interface is
``pipeline_gpt.GPTStage``'s.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from layers.embedding import Embedding
from layers.layer import BaseLayer, _rng_untouched
from models.gpt import GPT
from .tp_cross_entropy import VocabParallelCrossEntropy
from .tp_gpt import ParallelBlock, TensorParallelGPT, _copy_layernorm
from .tp_layers import VocabParallelEmbedding, shard_of
from .tp_mappings import CopyToTensorParallel, GatherFromSequenceParallel, all_reduce_, tp_rank_and_size


def vocab_rows(table: Tensor, rank: int, size: int) -> tuple[int, Tensor]:
    """(this rank's first id, its rows of ``table`` (V, C) padded with zero rows to Vp = size * ceil(V / size))."""
    v, c = table.shape
    per = -(-v // size)
    start = rank * per
    rows = torch.zeros(per, c, dtype=table.dtype, device=table.device)
    n = max(0, min(v - start, per))
    rows[:n] = table.detach()[start:start + n]
    return start, rows


class TensorParallelStage(BaseLayer):
    """``TensorParallelStage(gpt, stage, stages, group, sequence_parallel=False)``: the part of ``gpt`` that pipeline
    stage ``stage`` of ``stages`` runs, split over the tensor-parallel ``group``.

    ``forward``: token ids (b, T) on the first stage, the activation on the others -> the activation, or on the last
    stage this rank's vocabulary columns of the logits (b, T, Vp/Tp).  ``backward_input(dout)`` -> the input's
    gradient (None on the first stage); ``backward_weight()`` adds the weight gradients of the last
    ``backward_input``; ``loss()`` the last stage's vocabulary-parallel criterion."""

    _param_names = ("head",)

    def __init__(self, gpt: GPT, stage: int, stages: int, group, sequence_parallel: bool = False) -> None:
        rank, size = tp_rank_and_size(group)
        for what, n, parts, flag in (("n_head", gpt.n_head, size, "--tensor-parallel"),
                                     ("n_embd", gpt.n_embd, size, "--tensor-parallel"),
                                     ("n_layer", gpt.n_layer, stages, "--pipeline-parallel")):
            if n % parts:
                raise ValueError(f"tensor x pipeline parallelism: {what} {n} does not divide by {flag} {parts}")
        if gpt.dropout:
            raise ValueError(f"tensor x pipeline parallelism: dropout {gpt.dropout} is not supported (use --dropout 0)")
        per = gpt.n_layer // stages
        self.stage, self.stages, self.first, self.last = stage, stages, stage == 0, stage == stages - 1
        self.group, self.rank, self.size, self.sequence_parallel = group, rank, size, sequence_parallel
        self.vocab_size, self.n_embd, self.offset = gpt.vocab_size, gpt.n_embd, stage * per
        self.h = [ParallelBlock(b, rank, size, group, sequence_parallel) for b in gpt.h[self.offset:self.offset + per]]
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

    def named_children(self) -> Iterator[tuple[str, BaseLayer]]:
        if self.first:
            yield "transformer.wte", self.wte
            yield "transformer.wpe", self.wpe
        for i, block in enumerate(self.h):
            yield f"transformer.h.{self.offset + i}", block
        if self.last:
            yield "transformer.ln_f", self.ln_f

    def activation_shape(self, rows: int, seq: int) -> tuple[int, int, int]:
        """What one tensor rank sends to the next stage: (b, T, C), or (b, T/Tp, C) under sequence parallelism."""
        return rows, seq // self.size if self.sequence_parallel else seq, self.n_embd

    def loss(self) -> VocabParallelCrossEntropy:
        return VocabParallelCrossEntropy(self.start, self.vocab_size, self.group)

    def _out_weight(self) -> Tensor:
        return self.wte.weight if self.head is None else self.head

    def forward(self, inp: Tensor) -> Tensor:
        if self.first:
            B, T = inp.shape
            part = T // self.size if self.sequence_parallel else T  # positions a rank holds between split regions
            lo = self.rank * part if self.sequence_parallel else 0
            x = self.wte(inp) + self.wpe(torch.arange(lo, lo + part, device=inp.device))  # (b, part, C)
        else:
            x = inp
        for block in self.h:
            x = block(x)
        if not self.last:
            return x
        x = self.f(self.ln_f(x))  # (b, T, C): gathered along T under sequence parallelism
        self._x = x
        return x @ self._out_weight().t()  # (b, T, Vp/Tp)

    @torch.no_grad()
    def backward_input(self, dout: Tensor) -> Tensor | None:
        dx = dout
        if self.last:
            w = self._out_weight()
            d2 = dout.reshape(-1, w.shape[0])  # (b*T, Vp/Tp)
            self._head_w, self._x = (d2, self._x.reshape(-1, self.n_embd)), None  # the output layer's dW, for W
            dx = self.ln_f.backward_input(self.f.backward((d2 @ w).view(*dout.shape[:-1], self.n_embd)))
        for block in reversed(self.h):
            dx = block.backward_input(dx)
        if not self.first:
            return dx
        self.wpe.backward_input(dx.sum(0))  # (part, C)
        self.wte.backward_input(dx)
        return None

    @torch.no_grad()
    def backward_weight(self) -> None:
        if self.last:  # the output layer's share of the tied matrix first, as the GPT's backward
            (d2, x), self._head_w = self._head_w, None
            w = self._out_weight()
            if w.grad is None:
                w.grad = d2.t() @ x
            else:
                w.grad.addmm_(d2.t(), x)
            self.ln_f.backward_weight()
        for block in reversed(self.h):
            block.backward_weight()
        if self.first:
            self.wpe.backward_weight()
            self.wte.backward_weight()

    @torch.no_grad()
    def finish_gradients(self) -> None:
        """Under sequence parallelism: sum over the tensor-parallel group the gradients of the replicated parameters
        that saw only this rank's positions (this stage's layer norms, wpe, row-parallel biases); once, after the
        step's backwards.  Else nothing."""
        if not self.sequence_parallel:
            return
        partial = [self.wpe.weight] if self.first else []
        partial += [self.ln_f.weight, self.ln_f.bias] if self.last else []
        for block in self.h:
            partial += [block.ln_1.weight, block.ln_1.bias, block.ln_2.weight, block.ln_2.bias,
                        *block.attn.c_proj.partial_grads(), *block.mlp.c_proj.partial_grads()]
        for p in partial:
            if p is not None and p.grad is not None:
                p.grad = all_reduce_(p.grad, self.group)

    @torch.no_grad()
    def tie_gradients(self, group: dist.ProcessGroup | None) -> None:
        """Sum the token table's rows' gradient over their two copies (first stage's wte, last stage's head) of this
        tensor rank: call on the first and the last stage, in ``group`` (the two of them), after the backwards."""
        if self.stages == 1 or not (self.first or self.last):
            return
        w = self.wte.weight if self.first else self.head
        if w.grad is None:
            w.grad = torch.zeros_like(w)
        dist.all_reduce(w.grad, group=group)

    def full_state_dict(self, grad: bool = False) -> dict[str, Tensor]:
        """This stage's parameters (or gradients) whole, under the GPT's names, the output layer's copy left out
        (collective over the tensor-parallel group)."""
        out = TensorParallelGPT.full_state_dict(self, grad)
        out.pop("head", None)
        return out
