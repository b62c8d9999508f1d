"""Tensor-parallel layers by hand: column- and row-parallel Linear and a vocabulary-parallel Embedding.

Shape legend: N = positions (any leading axes), D = in_features, H = out_features, T = the tensor-parallel group's
size, r = this rank; V = vocabulary, Vp = V padded up to a multiple of T, C = embedding width.

    column-parallel  y_r = f(x) @ W_r^T + b_r      W_r: rows of W (H/T, D); each rank gets its slice of y
    row-parallel     y   = g(x_r @ W_r^T) + b      W_r: columns of W (H, D/T); x_r: this rank's slice of x
    vocab-parallel   e   = g(rows r*Vp/T.. of the table, looked up where the id falls in them, zero elsewhere)

The local products are ``layers.Linear``'s and ``layers.Embedding``'s own forward and backward on the shard (the
same tensor: their .grad is the shard's gradient); f and g are ``tp_mappings``'s.  A row-parallel bias is added
once, after g (added on every rank before the sum it would count T times); its gradient is sum(dout), the same on
every rank.  Each layer can ``gather()`` its full tensors (or their gradients) back in the one-process layout.

``sequence_parallel=True``: the input of a column-parallel layer and the output of a row-parallel one (and of the
embedding) are split along the sequence, (B, T/P, C); f becomes an all-gather along T and g a reduce-scatter along
T (``tp_mappings``).  The row-parallel bias is then added to this rank's positions only, so its gradient is a
partial sum: ``partial_grads()`` names it, to be all-reduced over the group after the backward.

For a zero-bubble pipeline each layer's backward also runs in two: ``backward_input`` (B: dx, with f's or g's
communication) and ``backward_weight`` (W: the shard's dW, later); B then W adds the same terms as ``backward``.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from layers.embedding import Embedding
from layers.layer import BaseLayer, _rng_untouched, accumulate_grad, no_graph
from layers.linear import Linear

from .tp_mappings import (
    CopyToTensorParallel,
    GatherFromSequenceParallel,
    ReduceFromTensorParallel,
    ReduceScatterToSequenceParallel,
    gather_rows,
)


def _local_linear(weight: Tensor, bias: Tensor | None) -> Linear:
    """A Linear whose parameters ARE the given shards (built without drawing from the global RNG)."""
    with _rng_untouched(weight.device):
        lin = Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype, device=weight.device)
    lin.weight, lin.bias = weight, bias
    return lin


def shard_of(param: Tensor, part: Tensor) -> Tensor:
    """A rank's own copy of ``part`` of ``param``, a parameter as ``param`` is: requiring a gradient where it does
    (frozen stays frozen; the layers give a gradient only to a parameter whose ``requires_grad`` is True)."""
    return part.clone().requires_grad_(param.requires_grad)


class ColumnParallelLinear(BaseLayer):
    """f, then this rank's rows of the Linear: x (*, D) -> its slice of y (*, H/T).

    ``rows``: which rows of the full (H, D) weight are this rank's (default: block r of T); the GPT's packed q, k, v
    projection takes rank r's heads from each of the three."""

    _param_names = ("weight", "bias")

    def __init__(
        self,
        full: Linear,
        rank: int,
        size: int,
        group=None,
        rows: Tensor | None = None,
        sequence_parallel: bool = False,
    ) -> None:
        h = full.out_features
        if h % size:
            raise ValueError(f"ColumnParallelLinear: out_features {h} does not divide among {size} ranks")
        self.rows = torch.arange(rank * (h // size), (rank + 1) * (h // size)) if rows is None else rows
        self.size, self.group = size, group
        self.weight = shard_of(full.weight, full.weight.detach()[self.rows])  # (H/T, D)
        self.bias = None if full.bias is None else shard_of(full.bias, full.bias.detach()[self.rows])  # (H/T,)
        self.f = GatherFromSequenceParallel(group) if sequence_parallel else CopyToTensorParallel(group)
        self._lin = _local_linear(self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self._lin.forward(self.f(x))

    def backward(self, dout: Tensor) -> Tensor:  # type: ignore[override]  # its own, without Template's need_input_grad
        return self.f.backward(self._lin.backward(dout))  # the ranks' partial dx summed

    @no_graph
    def backward_input(self, dout: Tensor) -> Tensor:
        """B: dx (the ranks' partial dx summed); dW waits for ``backward_weight``."""
        return self.f.backward(self._lin.backward_input(dout))

    @no_graph
    def backward_weight(self) -> None:
        self._lin.backward_weight()

    def gather(self, grad: bool = False) -> dict[str, Tensor]:
        """The full weight and bias (or their gradients), rows put back where ``rows`` took them from."""
        out = {}
        for name, t in (("weight", self.weight), ("bias", self.bias)):
            if t is not None:
                src = cast(Tensor, t.grad) if grad else t  # gathered after a backward: the gradient is there
                whole = gather_rows(src, self.group)
                order = gather_rows(self.rows, self.group)
                full = torch.empty_like(whole)
                full[order] = whole
                out[name] = full
        return out


class RowParallelLinear(BaseLayer):
    """This rank's columns of the Linear, then g, then the bias: x_r (*, D/T) -> y (*, H), the same on every rank."""

    _param_names = ("weight", "bias")

    def __init__(self, full: Linear, rank: int, size: int, group=None, sequence_parallel: bool = False) -> None:
        d = full.in_features
        if d % size:
            raise ValueError(f"RowParallelLinear: in_features {d} does not divide among {size} ranks")
        self.group = group
        self.weight = shard_of(
            full.weight, full.weight.detach()[:, rank * (d // size) : (rank + 1) * (d // size)]
        )  # (H, D/T)
        self.bias = None if full.bias is None else shard_of(full.bias, full.bias.detach())  # (H,) whole, on every rank
        self.g = ReduceScatterToSequenceParallel(group) if sequence_parallel else ReduceFromTensorParallel(group)
        self.sequence_parallel = sequence_parallel
        self._lin = _local_linear(self.weight, None)
        self._dbias: Tensor | None = None  # between backward_input and backward_weight: dout, for the bias

    def forward(self, x: Tensor) -> Tensor:
        y = self.g(self._lin.forward(x))  # (*, H) the partial products summed
        return y if self.bias is None else y.add_(self.bias)

    def backward(self, dout: Tensor) -> Tensor:  # type: ignore[override]  # its own, without Template's need_input_grad
        if self.bias is not None:
            accumulate_grad(self.bias, dout.reshape(-1, dout.shape[-1]).sum(0))  # (H,) this rank's positions' part
        return self._lin.backward(self.g.backward(dout))

    @no_graph
    def backward_input(self, dout: Tensor) -> Tensor:
        """B: this rank's slice of dx; the weight's and the bias's gradients wait for ``backward_weight``."""
        self._dbias = dout if self.bias is not None else None
        return self._lin.backward_input(self.g.backward(dout))

    @no_graph
    def backward_weight(self) -> None:
        dout, self._dbias = self._dbias, None
        if dout is not None:  # kept only with a bias
            accumulate_grad(cast(Tensor, self.bias), dout.reshape(-1, dout.shape[-1]).sum(0))
        self._lin.backward_weight()

    def partial_grads(self) -> list[Tensor]:
        return [self.bias] if self.sequence_parallel and self.bias is not None else []

    def gather(self, grad: bool = False) -> dict[str, Tensor]:
        w = cast(Tensor, self.weight.grad) if grad else self.weight  # gathered after a backward: it is there
        out = {"weight": gather_rows(w.t(), self.group).t()}  # the columns, in rank order
        if self.bias is not None:
            out["bias"] = cast(Tensor, self.bias.grad) if grad else self.bias
        return out


class VocabParallelEmbedding(BaseLayer):
    """Rows [r*Vp/T, (r+1)*Vp/T) of the (Vp, C) table; a lookup reads the rows it holds, zeros elsewhere, then g.

    ``full``: the one-process Embedding (V rows); the table is padded with zero rows to Vp = T * ceil(V / T), as
    Megatron pads it.  No id reaches a padded row, and the vocabulary-parallel loss keeps their logits out, so they
    get no gradient and stay zero."""

    _param_names = ("weight",)

    def __init__(self, full: Embedding, rank: int, size: int, group=None, sequence_parallel: bool = False) -> None:
        v, c = full.weight.shape
        self.vocab_size, self.group = v, group
        self.padded = -(-v // size) * size  # Vp
        per = self.padded // size
        self.start, self.end = rank * per, (rank + 1) * per  # this rank's ids
        table = torch.zeros(self.padded, c, dtype=full.weight.dtype, device=full.weight.device)
        table[:v] = full.weight.detach()
        self.weight = shard_of(full.weight, table[self.start : self.end])  # (Vp/T, C)
        with _rng_untouched(table.device):
            self._emb = Embedding(per, c, dtype=table.dtype, device=table.device)
        self._emb.weight = self.weight
        self.g = ReduceScatterToSequenceParallel(group) if sequence_parallel else ReduceFromTensorParallel(group)
        self._outside: Tensor | None = None

    def forward(self, idx: Tensor) -> Tensor:
        outside = (idx < self.start) | (idx >= self.end)  # ids another rank holds
        out = self._emb.forward((idx - self.start).masked_fill(outside, 0))  # (*, C); row 0 stands in, zeroed below
        self._outside = outside
        return self.g(out.masked_fill_(outside.unsqueeze(-1), 0.0))

    def backward(self, dout: Tensor) -> None:  # type: ignore[override]  # its own, without Template's need_input_grad
        outside, self._outside = cast(Tensor, self._outside), None  # the forward's
        self._emb.backward(self.g.backward(dout).masked_fill(outside.unsqueeze(-1), 0.0))  # only the rows held here

    @no_graph
    def backward_input(self, dout: Tensor) -> None:
        """B: the lookup has no input gradient; the rows' gradients wait for ``backward_weight``."""
        outside, self._outside = cast(Tensor, self._outside), None  # the forward's
        self._emb.backward_input(self.g.backward(dout).masked_fill(outside.unsqueeze(-1), 0.0))

    @no_graph
    def backward_weight(self) -> None:
        self._emb.backward_weight()

    def gather(self, grad: bool = False) -> dict[str, Tensor]:
        w = cast(Tensor, self.weight.grad) if grad else self.weight  # gathered after a backward: it is there
        return {"weight": gather_rows(w, self.group)[: self.vocab_size]}
