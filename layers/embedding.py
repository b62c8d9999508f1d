"""Embedding: a lookup table of vectors, one row per token id; its backward is a scatter-add.

Shape legend: V = num_embeddings (the table's rows, e.g. the vocabulary), D = embedding_dim,
idx = integer token ids of any shape (*), e.g. (B, T).
"""

from __future__ import annotations

from typing import NamedTuple, NoReturn

import torch
from torch import Tensor

import kernels
from kernels import linear

from .checks import capturing, check_int, check_tensor
from .layer import BaseLayer, learned


class Embedding(BaseLayer):
    """out[..., :] = weight[idx[...], :]:  a row of the (V, D) table per token id.

    Backward: each position's upstream gradient goes to the row it was read from, so a token that
    occurs several times receives the *sum* of their gradients (llm.c's ``encoder_backward``):

        dweight = zeros(V, D);  dweight[idx[p]] += dout[p]  for every position p   (``index_add_``)

    A lookup is not differentiable in the integer ids: ``backward`` returns None.  The row
    ``padding_idx`` (if given) is initialised to zeros and gets no gradient, as nn.Embedding's.
    Initialised as nn.Embedding, N(0, 1) from the global RNG, so one seed gives identical tables.
    Kept from forward to backward: the ids (a view of idx); changing idx in place in between is refused
    (layers/saved.py).  The table is not read by the backward (nor kept by autograd's): changing it is allowed.
    ``max_norm``, ``scale_grad_by_freq`` and ``sparse=True`` are nn.Embedding options handgrad does not
    implement: asking for one is an error naming it.

    Written in the template (layers/template.py); the kernel (kernels/linear.py) scatters straight into ``.grad``.
    The ids have no gradient, so the generic ``backward_input`` only checks dout and
    ``backward_weight`` does the whole scatter-add.
    """

    _param_names = ("weight",)
    _saved_labels = {"idx": "its input idx"}
    torch_class = torch.nn.Embedding
    _ctor_args = ("num_embeddings", "embedding_dim", "padding_idx", "max_norm", "scale_grad_by_freq", "sparse")

    class Saved(NamedTuple):
        idx: Tensor  # (P,) the ids flattened, P = prod(*) positions: a view of the caller's idx

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        self.num_embeddings = check_int("Embedding", "num_embeddings", num_embeddings)
        self.embedding_dim = check_int("Embedding", "embedding_dim", embedding_dim)
        unsupported = [
            f"{name}={value!r}"
            for name, value, default in (
                ("max_norm", max_norm, None),
                ("scale_grad_by_freq", scale_grad_by_freq, False),
                ("sparse", sparse, False),
            )
            if value != default
        ]
        if unsupported:
            raise ValueError(
                f"Embedding: {', '.join(unsupported)} is not implemented by handgrad "
                f"(supported: num_embeddings, embedding_dim, padding_idx)"
            )
        if padding_idx is not None:
            check_int(
                "Embedding",
                "padding_idx",
                padding_idx,
                -num_embeddings,
                num_embeddings - 1,
                why=f" (the table has {num_embeddings} rows)",
            )
            padding_idx %= num_embeddings  # a negative index counts from the end, as torch normalises it
        if dtype is not None and not dtype.is_floating_point:
            raise ValueError(f"Embedding: dtype must be floating point, got {dtype}")
        self.padding_idx = padding_idx
        self.max_norm, self.scale_grad_by_freq, self.sparse = None, False, False  # what to_torch passes on
        self.weight = torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype)  # (V, D)
        torch.nn.init.normal_(self.weight)
        if padding_idx is not None:
            self.weight[padding_idx].zero_()
        learned(self.weight)

    def extra_repr(self) -> str:
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"

    def forward_math(self, idx: Tensor):
        """idx: integer (*) -> out: (*, D)."""
        flat = idx.reshape(-1)  # (P,)
        out = self.weight.index_select(0, flat)  # (P, D): a copy of each looked-up row
        return out.view(*idx.shape, self.embedding_dim), self.Saved(flat)  # (*, D)

    def backward_math(self, dout: Tensor, saved: Saved):
        """dout: (*, D) -> None (ids have no gradient), and dweight (V, D): dout's rows added at their ids."""
        idx = saved.idx  # (P,)
        dout = dout.reshape(-1, self.embedding_dim)  # (P, D)
        if self.padding_idx is not None:  # the padding row gets no gradient: its positions contribute zero
            dout = dout.masked_fill((idx == self.padding_idx).unsqueeze(1), 0)
        if kernels.enabled():  # straight into .grad, no (V, D) temporary: kernels/linear.py
            return None, {"weight": linear.embedding_backward(dout, idx)}
        dweight = torch.zeros_like(self.weight)  # (V, D)
        dweight.index_add_(0, idx.reshape(-1), dout.reshape(-1, dout.shape[-1]))  # repeated ids add up
        return None, {"weight": dweight}

    def check_input(self, idx: object) -> None:
        w = self.weight
        if not (isinstance(idx, Tensor) and idx.dtype in (torch.int64, torch.int32) and idx.device == w.device):
            self._reject_input(idx)
        self._check_range(idx)

    def _check_range(self, idx: Tensor) -> None:
        """Every id in [0, V): one read-back of the smallest and largest id (skipped while a CUDA graph is
        being captured, where a read-back is illegal; an eager step before capture checks them)."""
        if idx.numel() == 0 or capturing(idx):
            return
        if torch.compiler.is_compiling():  # no read-back in a graph: the same check, as an assertion the graph runs
            torch._assert_async(
                ((idx >= 0) & (idx < self.num_embeddings)).all(),
                f"{self!r}: an index is out of range for a table of {self.num_embeddings} rows "
                f"(ids must be in [0, {self.num_embeddings - 1}])",
            )
            return
        lo, hi = torch.stack(torch.aminmax(idx)).tolist()
        if lo < 0 or hi >= self.num_embeddings:
            bad = lo if lo < 0 else hi
            raise IndexError(
                f"{self!r}: index {bad} is out of range for a table of {self.num_embeddings} rows "
                f"(ids must be in [0, {self.num_embeddings - 1}])"
            )

    def _reject_input(self, idx: object) -> NoReturn:
        idx = check_tensor(repr(self), "idx", idx)
        if idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{self!r}: idx must hold integer token ids (int64 or int32), got dtype {idx.dtype}")
        raise ValueError(
            f"{self!r}: idx is on {idx.device} but the table is on {self.weight.device}; "
            f"move one of them (e.g. layer.to(device='{idx.device}'))"
        )
