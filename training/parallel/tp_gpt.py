"""The GPT split across a tensor-parallel group (Megatron's layout), built from a one-process ``models.GPT``.

Shape legend as models/gpt.py's: B, T (sequence), C, V, nh, hs = C / nh; P = the group's size, r = this rank.

    wte        vocabulary-parallel: rows r*Vp/P.. of the padded (Vp, C) table; the lookup ends in g
    attention  c_attn column-parallel (rank r's nh/P heads of q, k and v), attention on those heads alone,
               c_proj row-parallel (the heads' columns), ending in g
    mlp        c_fc column-parallel (4C/P), GELU on the slice, c_proj row-parallel, ending in g
    ln_*, wpe  replicated: their inputs are the same on every rank, so are their gradients
    logits     f, then the local rows of the tied table: (B, T, Vp/P) stays split into the vocab-parallel loss

Per block, forward: two all-reduces of (B, T, C) (the two g's); backward: two (the two f's).  Attention and MLP
hold 1/P of their weights and of their (B, T, 4C) and per-head activations.

``sequence_parallel=True``: between the split regions the residual stream is split along the sequence, (B, T/P, C)
a rank, so the layer norms, the residual adds and wpe run on 1/P of the positions; each f is an all-gather along T
and each g a reduce-scatter (``tp_mappings``).  The replicated parameters (layer norms, wpe, the row-parallel
biases) then see only their rank's positions: ``finish_gradients()`` all-reduces their gradients over the group,
once, after the step's backwards.  Dropout is refused (its masks would
have to be drawn for the whole model's heads and widths on every rank).  Parameter names are the GPT's, holding
this rank's shards; ``full_state_dict()`` gathers them back into the GPT's layout.  A block's backward also runs in
two, ``backward_input`` then ``backward_weight`` (a zero-bubble pipeline's B and W: tp_pipeline.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import cast

import torch
from torch import Tensor

from layers.activations import GELU
from layers.attention import ScaledDotProductAttention
from layers.embedding import Embedding
from layers.layer import BaseLayer, _rng_untouched, no_graph
from layers.layernorm import LayerNorm
from models.gpt import GPT

from .tp_cross_entropy import VocabParallelCrossEntropy
from .tp_layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, shard_of
from .tp_mappings import CopyToTensorParallel, GatherFromSequenceParallel, all_reduce_, tp_rank_and_size


def _copy_layernorm(ln: LayerNorm) -> LayerNorm:
    w = cast(Tensor, ln.weight)  # the GPT's layer norms are affine
    out = LayerNorm(ln.normalized_shape, eps=ln.eps, bias=ln.bias is not None, dtype=w.dtype, device=w.device)
    out.load_state_dict(ln.state_dict())
    return out


class ParallelSelfAttention(BaseLayer):
    """nanoGPT's causal self-attention on this rank's nh/P heads: x (B, T, C) -> (B, T, C), the same on every rank."""

    def __init__(self, attn, rank: int, size: int, group, sp: bool = False) -> None:
        C, nh = attn.n_embd, attn.n_head
        self.local, self.n_head = C // size, nh // size  # this rank's width and heads
        self.hs = C // nh
        block = torch.arange(rank * self.local, (rank + 1) * self.local)
        rows = torch.cat([block, block + C, block + 2 * C])  # rank r's heads of q, of k, of v
        self.c_attn = ColumnParallelLinear(attn.c_attn, rank, size, group, rows=rows, sequence_parallel=sp)
        self.c_proj = RowParallelLinear(attn.c_proj, rank, size, group, sequence_parallel=sp)
        self.attention = ScaledDotProductAttention()

    def named_children(self) -> Iterator[tuple[str, BaseLayer]]:
        return iter((("c_attn", self.c_attn), ("c_proj", self.c_proj)))

    def forward(self, x: Tensor) -> Tensor:
        qkv = self.c_attn(x)  # (B, T, 3C/P): the whole sequence (gathered, under sequence parallelism)
        B, T, _ = qkv.shape
        heads = lambda t: t.view(B, T, self.n_head, self.hs).transpose(1, 2)  # noqa: E731  (B, nh/P, T, hs)
        q, k, v = qkv.split(self.local, dim=2)  # (B, T, C/P) each
        y = self.attention(
            heads(q), heads(k), heads(v), is_causal=True, scale=1.0 / math.sqrt(self.hs)
        )  # (B, nh/P, T, hs)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, self.local))

    def backward(self, dy: Tensor) -> Tensor:  # type: ignore[override]  # its own, without Template's need_input_grad
        return self._back(dy, "backward")

    @no_graph
    def backward_input(self, dy: Tensor) -> Tensor:
        """B: dx through c_proj's and c_attn's input gradients (the attention has no weights); W later."""
        return self._back(dy, "backward_input")

    def _back(self, dy: Tensor, way: str) -> Tensor:
        """The chain rule back through the attention, each Linear taking ``way``: its whole backward, or its B."""
        dy = getattr(self.c_proj, way)(dy)  # (B, T, C/P)
        B, T, _ = dy.shape
        dq, dk, dv = self.attention.backward(dy.view(B, T, self.n_head, self.hs).transpose(1, 2))
        dqkv = torch.cat([d.transpose(1, 2).reshape(B, T, self.local) for d in (dq, dk, dv)], dim=2)
        return getattr(self.c_attn, way)(dqkv)

    @no_graph
    def backward_weight(self) -> None:
        self.c_proj.backward_weight()
        self.c_attn.backward_weight()


class ParallelMLP(BaseLayer):
    """c_fc column-parallel, GELU on this rank's 4C/P, c_proj row-parallel."""

    def __init__(self, mlp, rank: int, size: int, group, sp: bool = False) -> None:
        self.c_fc = ColumnParallelLinear(mlp.c_fc, rank, size, group, sequence_parallel=sp)
        self.gelu = GELU()
        self.c_proj = RowParallelLinear(mlp.c_proj, rank, size, group, sequence_parallel=sp)

    def named_children(self) -> Iterator[tuple[str, BaseLayer]]:
        return iter((("c_fc", self.c_fc), ("c_proj", self.c_proj)))

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))

    def backward(self, dy: Tensor) -> Tensor:  # type: ignore[override]  # its own, without Template's need_input_grad
        return self._back(dy, "backward")

    @no_graph
    def backward_input(self, dy: Tensor) -> Tensor:
        return self._back(dy, "backward_input")

    def _back(self, dy: Tensor, way: str) -> Tensor:
        """c_proj, GELU, c_fc backwards; the Linears take ``way``: their whole backward, or their B."""
        return getattr(self.c_fc, way)(self.gelu.backward(getattr(self.c_proj, way)(dy)))

    @no_graph
    def backward_weight(self) -> None:
        self.c_proj.backward_weight()
        self.c_fc.backward_weight()


def sum_partial_grads(replicated: list[Tensor | None], blocks: list[ParallelBlock], group) -> None:
    """Under sequence parallelism, after the step's backwards: all-reduce over ``group`` the gradients that saw only
    this rank's positions -- the ``replicated`` parameters given (wpe, ln_f) and the blocks' layer norms and
    row-parallel biases."""
    partial = list(replicated)
    for block in blocks:
        partial += [
            block.ln_1.weight,
            block.ln_1.bias,
            block.ln_2.weight,
            block.ln_2.bias,
            *block.attn.c_proj.partial_grads(),
            *block.mlp.c_proj.partial_grads(),
        ]
    for p in partial:
        if p is not None and p.grad is not None:
            p.grad = all_reduce_(p.grad, group)


class ParallelBlock(BaseLayer):
    """x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), the attention and MLP split, the layer norms replicated."""

    def __init__(self, block, rank: int, size: int, group, sp: bool = False) -> None:
        self.ln_1, self.ln_2 = _copy_layernorm(block.ln_1), _copy_layernorm(block.ln_2)
        self.attn = ParallelSelfAttention(block.attn, rank, size, group, sp)
        self.mlp = ParallelMLP(block.mlp, rank, size, group, sp)

    def named_children(self) -> Iterator[tuple[str, BaseLayer]]:
        return iter((("ln_1", self.ln_1), ("attn", self.attn), ("ln_2", self.ln_2), ("mlp", self.mlp)))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def backward(self, dy: Tensor) -> Tensor:  # type: ignore[override]  # its own, without Template's need_input_grad
        return self._back(dy, "backward")

    @no_graph
    def backward_input(self, dy: Tensor) -> Tensor:
        """B: ``backward``'s dx, every weight gradient left to ``backward_weight`` (a pipeline's W)."""
        return self._back(dy, "backward_input")

    def _back(self, dy: Tensor, way: str) -> Tensor:
        """Each residual branch back, last first; every layer takes ``way``: its whole backward, or its B."""
        dy = dy + getattr(self.ln_2, way)(getattr(self.mlp, way)(dy))
        return dy + getattr(self.ln_1, way)(getattr(self.attn, way)(dy))

    @no_graph
    def backward_weight(self) -> None:
        for layer in (self.mlp, self.ln_2, self.attn, self.ln_1):  # backward's order
            layer.backward_weight()


class TensorParallelGPT(BaseLayer):
    """``TensorParallelGPT(gpt, group=None)``: this rank's part of ``gpt`` (the same weights on every rank, e.g. built
    under one seed); ``forward(idx (B, T)) -> logits (B, T, Vp/P)`` this rank's vocabulary columns;
    ``backward(dlogits_local)``; ``loss()`` the matching ``VocabParallelCrossEntropy``."""

    def __init__(self, gpt: GPT, group=None, sequence_parallel: bool = False) -> None:
        if gpt.dropout:
            raise ValueError(f"tensor parallelism: dropout {gpt.dropout} is not supported (use --dropout 0)")
        rank, size = tp_rank_and_size(group)
        for what, n in (("n_head", gpt.n_head), ("n_embd", gpt.n_embd)):
            if n % size:
                raise ValueError(f"tensor parallelism: {what} {n} does not divide by --tensor-parallel {size}")
        self.group, self.rank, self.size = group, rank, size
        self.vocab_size, self.n_embd = gpt.vocab_size, gpt.n_embd
        self.sequence_parallel = sp = sequence_parallel
        self.wte = VocabParallelEmbedding(gpt.wte, rank, size, group, sequence_parallel=sp)
        w = gpt.wpe.weight
        with _rng_untouched(w.device):
            self.wpe = Embedding(w.shape[0], w.shape[1], dtype=w.dtype, device=w.device)  # replicated
        self.wpe.weight = shard_of(w, w.detach())
        self.h = [ParallelBlock(b, rank, size, group, sp) for b in gpt.h]
        self.ln_f = _copy_layernorm(gpt.ln_f)
        self.f = GatherFromSequenceParallel(group) if sp else CopyToTensorParallel(group)
        self._cache: Tensor | None = None  # the output layer's input, from forward to backward

    def named_children(self) -> Iterator[tuple[str, BaseLayer]]:
        yield "transformer.wte", self.wte
        yield "transformer.wpe", self.wpe
        for i, block in enumerate(self.h):
            yield f"transformer.h.{i}", block
        yield "transformer.ln_f", self.ln_f

    def loss(self) -> VocabParallelCrossEntropy:
        return VocabParallelCrossEntropy(self.wte.start, self.vocab_size, self.group)

    def forward(self, idx: Tensor) -> Tensor:
        B, T = idx.shape
        part = T // self.size if self.sequence_parallel else T  # positions a rank holds between the split regions
        first = self.rank * part if self.sequence_parallel else 0
        x = self.wte(idx) + self.wpe(torch.arange(first, first + part, device=idx.device))  # (B, part, C)
        for block in self.h:
            x = block(x)
        x = self.f(self.ln_f(x))  # (B, T, C): gathered along T under sequence parallelism
        self._cache = x
        return x @ self.wte.weight.t()  # (B, T, Vp/P) this rank's columns of the tied output layer

    def backward(self, dlogits: Tensor) -> None:  # type: ignore[override]  # its own, without Template's need_input_grad
        x, self._cache = cast(Tensor, self._cache), None  # the forward's
        w = self.wte.weight
        d2 = dlogits.reshape(-1, w.shape[0])  # (B*T, Vp/P)
        if w.grad is None:  # the output layer's share of the tied matrix first, as the GPT's backward
            w.grad = d2.t() @ x.reshape(-1, self.n_embd)
        else:
            w.grad.addmm_(d2.t(), x.reshape(-1, self.n_embd))
        dx = self.ln_f.backward(self.f.backward((d2 @ w).view_as(x)))  # f: the ranks' partial dx summed (scattered)
        for block in reversed(self.h):
            dx = block.backward(dx)
        self.wpe.backward(dx.sum(0))
        self.wte.backward(dx)

    def finish_gradients(self) -> None:
        """Under sequence parallelism: sum over the group the gradients of the parameters that saw only this rank's
        positions (layer norms, wpe, row-parallel biases); call once after the step's backwards.  Else nothing."""
        if self.sequence_parallel:
            sum_partial_grads([self.wpe.weight, self.ln_f.weight, self.ln_f.bias], self.h, self.group)

    def full_state_dict(self, grad: bool = False) -> dict[str, Tensor]:
        """Every parameter (or its gradient) whole, under the GPT's names, the same on every rank (collective: every
        rank of the group calls it)."""
        out = {}

        def walk(layer, prefix):
            if hasattr(layer, "gather"):
                out.update((prefix + k, v) for k, v in layer.gather(grad).items())
                return
            for name in getattr(layer, "_param_names", ()):
                t = getattr(layer, name)
                if t is not None:
                    out[prefix + name] = t.grad if grad else t
            for cname, child in layer.named_children():
                walk(child, f"{prefix}{cname}.")

        walk(self, "")
        return out
