"""Embedding: a lookup table of vectors, one row per token id; its backward is a scatter-add.

Shape legend: V = num_embeddings (the table's rows, e.g. the vocabulary), D = embedding_dim,
idx = integer token ids of any shape (*), e.g. (B, T).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .checks import capturing, check_backward_dout, check_int, check_tensor
from .layer import BaseLayer, learned, wants_grad
from .saved import check_versions, versions


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
    """

    _param_names = ("weight",)
    torch_class = torch.nn.Embedding
    _ctor_args = ("num_embeddings", "embedding_dim", "padding_idx", "max_norm", "scale_grad_by_freq", "sparse")

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        self.num_embeddings = check_int("Embedding", "num_embeddings", num_embeddings)
        self.embedding_dim = check_int("Embedding", "embedding_dim", embedding_dim)
        unsupported = [f"{name}={value!r}" for name, value, default in
                       (("max_norm", max_norm, None), ("scale_grad_by_freq", scale_grad_by_freq, False),
                        ("sparse", sparse, False)) if value != default]
        if unsupported:
            raise ValueError(f"Embedding: {', '.join(unsupported)} is not implemented by handgrad "
                             f"(supported: num_embeddings, embedding_dim, padding_idx)")
        if padding_idx is not None:
            if isinstance(padding_idx, bool) or not isinstance(padding_idx, int) \
                    or not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx must be an int in [{-num_embeddings}, {num_embeddings - 1}] "
                                 f"(the table has {num_embeddings} rows), got {padding_idx!r}")
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
        self._cache: tuple[Tensor, torch.Size] | None = None  # (flat ids (P,), output shape)

    def extra_repr(self) -> str:
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"

    def forward(self, idx: Tensor) -> Tensor:
        """idx: integer (*) -> out: (*, D)."""
        w = self.weight
        if not (isinstance(idx, Tensor) and idx.dtype in (torch.int64, torch.int32) and idx.device == w.device):
            self._reject_input(idx)
        self._check_range(idx)
        flat = idx.reshape(-1)  # (P,) P = prod(*) positions
        out = w.index_select(0, flat)  # (P, D): a copy of each looked-up row
        shape = torch.Size((*idx.shape, self.embedding_dim))
        self._cache = (flat, shape)
        self._versions = versions(flat)
        return out.view(shape)  # (*, D)

    def backward(self, dout: Tensor) -> None:
        """dout: (*, D) -> None (ids have no gradient); adds the scatter-add of dout into weight.grad (V, D)."""
        cache, w = self._cache, self.weight
        check_backward_dout(self, dout, *((cache[1], w.dtype, w.device) if cache is not None else (None, None, None)))
        self._cache = None
        flat, _ = cache
        check_versions(self, ("its input idx",), (flat,), self._versions)
        d = dout.reshape(-1, self.embedding_dim)  # (P, D)
        if self.padding_idx is not None:  # the padding row gets no gradient: its positions contribute zero
            d = d.masked_fill((flat == self.padding_idx).unsqueeze(1), 0)
        if not wants_grad(w):  # frozen: no scatter-add
            return None
        if w.grad is None:
            w.grad = torch.zeros_like(w)
        w.grad.index_add_(0, flat, d)  # (V, D): repeated ids add up
        return None

    # -- the backward split in two: B (the input gradient, now) and W (the weight gradient, later) ----------------
    # Token ids have no gradient: B only checks dout and keeps it with the ids; W is the whole scatter-add.

    @torch.no_grad()
    def backward_input(self, dout: Tensor) -> None:
        """B: checks dout (*, D) and keeps it for ``backward_weight()``; returns None (ids have no gradient)."""
        if getattr(self, "_pending_w", None) is not None:
            raise RuntimeError(f"{self!r}: backward_input() again before backward_weight() of the previous one")
        cache, w = self._cache, self.weight
        check_backward_dout(self, dout, *((cache[1], w.dtype, w.device) if cache is not None else (None, None, None)))
        self._cache = None
        flat, _ = cache
        check_versions(self, ("its input idx",), (flat,), self._versions)
        self._pending_w = (flat, dout, self._versions)
        return None

    @torch.no_grad()
    def backward_weight(self) -> None:
        """W: adds the scatter-add of the kept dout at the kept ids into weight.grad (V, D)."""
        pending, self._pending_w = getattr(self, "_pending_w", None), None
        if pending is None:
            raise RuntimeError(f"{self!r}: backward_weight() needs a backward_input() before it (one W per B)")
        flat, dout, recorded = pending
        check_versions(self, ("its input idx",), (flat,), recorded)
        if not wants_grad(self.weight):
            return
        w = self.weight
        d = dout.reshape(-1, self.embedding_dim)  # (P, D)
        if self.padding_idx is not None:  # the padding row gets no gradient: its positions contribute zero
            d = d.masked_fill((flat == self.padding_idx).unsqueeze(1), 0)
        if w.grad is None:
            w.grad = torch.zeros_like(w)
        w.grad.index_add_(0, flat, d)  # (V, D): repeated ids add up

    def _check_range(self, idx: Tensor) -> None:
        """Every id in [0, V): one read-back of the smallest and largest id (skipped while a CUDA graph is
        being captured, where a read-back is illegal; an eager step before capture checks them)."""
        if idx.numel() == 0 or capturing(idx):
            return
        if torch.compiler.is_compiling():  # no read-back in a graph: the same check, as an assertion the graph runs
            torch._assert_async(((idx >= 0) & (idx < self.num_embeddings)).all(),
                                f"{self!r}: an index is out of range for a table of {self.num_embeddings} rows "
                                f"(ids must be in [0, {self.num_embeddings - 1}])")
            return
        lo, hi = torch.stack(torch.aminmax(idx)).tolist()
        if lo < 0 or hi >= self.num_embeddings:
            bad = lo if lo < 0 else hi
            raise IndexError(f"{self!r}: index {bad} is out of range for a table of {self.num_embeddings} rows "
                             f"(ids must be in [0, {self.num_embeddings - 1}])")

    def _reject_input(self, idx: object) -> None:
        check_tensor(repr(self), "idx", idx)
        if idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{self!r}: idx must hold integer token ids (int64 or int32), got dtype {idx.dtype}")
        raise ValueError(f"{self!r}: idx is on {idx.device} but the table is on {self.weight.device}; "
                         f"move one of them (e.g. layer.to(device='{idx.device}'))")
