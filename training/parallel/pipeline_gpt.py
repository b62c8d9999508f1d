"""The GPT cut into pipeline stages, each with the backward split in two (B, then W later), and a stage's copy per
micro-batch.

Shape legend as models/gpt.py's.  P stages of n_layer / P blocks each; stage 0 also holds the embeddings, stage P-1
the final layer norm and the output layer.  The output layer is the token table (tied): with P > 1 the last stage
holds a copy of it, ``head``, and after each step's backwards the two gradients are summed between the first and
the last stage (``tie_gradients``), as Megatron does, so both copies take the same step and stay equal.
``PipelineStage`` holds the forward, B, W and that sum; ``GPTStage`` and ``tp_pipeline.TensorParallelStage`` are the
plain stage and the tensor-parallel one.

A layer keeps one forward's cache until its backward, and a pipeline holds several micro-batches in flight, so each
micro-batch runs on its own copy of the stage (``replicate``): new layer objects, the very same parameter tensors,
so the W's of every micro-batch add into the same .grad.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor

from layers.layer import BaseLayer
from losses import CrossEntropyLoss
from models.gpt import GPT


def replicate(layer):
    """A copy of a layer tree for one micro-batch: every layer object copied, every parameter tensor shared."""
    twin = copy.copy(layer)
    for name, value in vars(layer).items():
        if isinstance(value, BaseLayer):
            setattr(twin, name, replicate(value))
        elif isinstance(value, list) and value and all(isinstance(v, BaseLayer) for v in value):
            setattr(twin, name, [replicate(v) for v in value])
    return twin


class PipelineStage(BaseLayer):
    """What every stage of the GPT's pipeline shares, whatever its blocks: the children under the GPT's names, the
    split backward (B, then W) and the tied table's gradient sum.  A subclass sets ``first``, ``last``, ``stages``,
    ``offset``, ``h``, ``wte``, ``wpe``, ``ln_f``, ``head`` and ``n_embd``, and gives ``_embed`` (the first stage's
    input from the token ids); ``_head_input`` and its backward are what stands between ``ln_f`` and the output
    layer."""

    _param_names = ("head",)

    # Set by the subclass (above).  The layers are the GPT's or their tensor-parallel versions, and None on a stage
    # that does not hold them: typed Any, each read under the flag (first, last) that says the stage holds it.
    first: bool
    last: bool
    stages: int
    offset: int
    n_embd: int
    h: list[Any]
    wte: Any
    wpe: Any
    ln_f: Any
    head: Tensor | None
    _embed: Callable[[Tensor], Tensor]
    _x: Tensor | None  # the last stage's output-layer input, from forward to B
    _head_w: tuple[Tensor, Tensor] | None  # (the logits' gradient, that input), from B to W

    def named_children(self) -> Iterator[tuple[str, BaseLayer]]:
        if self.first:
            yield "transformer.wte", self.wte
            yield "transformer.wpe", self.wpe
        for i, block in enumerate(self.h):
            yield f"transformer.h.{self.offset + i}", block
        if self.last:
            yield "transformer.ln_f", self.ln_f

    def _out_weight(self) -> Tensor:
        return self.wte.weight if self.head is None else self.head

    def _head_input(self, x: Tensor) -> Tensor:
        """What stands between ``ln_f`` and the output layer: nothing on a plain stage, f on a tensor-parallel one."""
        return x

    def _head_input_backward(self, dx: Tensor) -> Tensor:
        """``_head_input``'s backward: the gradient at ``ln_f``'s output from the one at the output layer's input."""
        return dx

    def forward(self, inp: Tensor) -> Tensor:
        x = self._embed(inp) if self.first else inp  # (B, T, C)
        for block in self.h:
            x = block(x)
        if not self.last:
            return x
        x = self._head_input(self.ln_f(x))
        self._x = x
        return x @ self._out_weight().t()  # (B, T, V)

    @torch.no_grad()
    def backward_input(self, dout: Tensor) -> Tensor | None:
        dx = dout
        if self.last:
            w = self._out_weight()  # (V, C), or this rank's vocabulary rows
            d2 = dout.reshape(-1, w.shape[0])  # (B*T, V)
            x = cast(Tensor, self._x)  # this micro-batch's forward kept it
            self._head_w, self._x = (d2, x.reshape(-1, self.n_embd)), None  # the output layer's dW, for W
            dx = self.ln_f.backward_input(self._head_input_backward((d2 @ w).view(*dout.shape[:-1], self.n_embd)))
        for block in reversed(self.h):
            dx = block.backward_input(dx)
        if not self.first:
            return dx
        self.wpe.backward_input(dx.sum(0))  # (T, C), or the positions this rank holds
        self.wte.backward_input(dx)
        return None

    @torch.no_grad()
    def backward_weight(self) -> None:
        if self.last:  # the output layer's share of the tied matrix first, as the GPT's backward
            (d2, x), self._head_w = cast(tuple[Tensor, Tensor], self._head_w), None  # B kept it
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
    def tie_gradients(self, group: dist.ProcessGroup | None) -> None:
        """Sum the token table's gradient over its two copies (first stage's wte, last stage's head): call on the
        first and the last stage, in ``group`` (the two of them), after the step's backwards."""
        if self.stages == 1 or not (self.first or self.last):
            return
        w = self.wte.weight if self.first else cast(Tensor, self.head)  # the last of two or more stages holds it
        if w.grad is None:
            w.grad = torch.zeros_like(w)
        dist.all_reduce(w.grad, group=group)


class GPTStage(PipelineStage):
    """``GPTStage(gpt, stage, stages)``: the part of ``gpt`` that stage ``stage`` of ``stages`` runs.

    ``forward``: token ids (B, T) on the first stage, the activation (B, T, C) on the others -> the activation, or
    on the last stage the logits (B, T, V).  ``backward_input(dout)`` -> the input's gradient (None on the first
    stage); ``backward_weight()`` adds the weight gradients of the last ``backward_input``."""

    def __init__(self, gpt: GPT, stage: int, stages: int) -> None:
        if gpt.n_layer % stages:
            raise ValueError(
                f"pipeline parallelism: n_layer {gpt.n_layer} does not divide by {stages} stages "
                f"(--pipeline-parallel x the stages a rank holds)"
            )
        if gpt.dropout:
            raise ValueError(f"pipeline parallelism: dropout {gpt.dropout} is not supported (use --dropout 0)")
        per = gpt.n_layer // stages
        self.stage, self.stages, self.first, self.last = stage, stages, stage == 0, stage == stages - 1
        self.offset = stage * per  # the global index of this stage's first block
        self.h = gpt.h[self.offset : self.offset + per]
        self.wte, self.wpe = (gpt.wte, gpt.wpe) if self.first else (None, None)
        self.ln_f = gpt.ln_f if self.last else None
        # the output layer: the token table itself on a single stage, else the last stage's copy of it
        self.head = (
            None
            if not self.last or self.first
            else gpt.wte.weight.detach().clone().requires_grad_(gpt.wte.weight.requires_grad)
        )
        self.vocab_size, self.n_embd = gpt.vocab_size, gpt.n_embd
        self._head_w = self._x = None

    def activation_shape(self, rows: int, seq: int) -> tuple[int, int, int]:
        """What a stage sends to the next: the residual stream (b, T, C)."""
        return rows, seq, self.n_embd

    def loss(self) -> CrossEntropyLoss:
        """The last stage's criterion on its logits (the mean over the micro-batch's positions)."""
        return CrossEntropyLoss()

    def _embed(self, idx: Tensor) -> Tensor:
        """The first stage's input: token ids (B, T) -> wte + wpe, (B, T, C)."""
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
