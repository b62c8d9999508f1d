"""Dropout's masks: inverted dropout, the mask between recurrent layers, and ``SeededDropout`` for the twins."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .checks import check_bool, check_probability
from .layer import BaseLayer


class Dropout(BaseLayer):
    """Inverted dropout: in training, each element is zeroed with probability ``p`` (torch's meaning: the
    probability of DROPPING; CS231n's p is of keeping) and the survivors are scaled by 1 / (1 - p), so the
    expected output equals the input and eval mode is the identity:

        mask = bernoulli(1 - p) / (1 - p)     (N, ...) values 0 or 1/(1-p)
        out  = x * mask                        dx = dout * mask   (the forward's mask, reused)

    ``p = 0`` and eval mode: out = x, dx = dout, nothing drawn.  ``p = 1``: zeros, as torch gives, nothing drawn.
    The mask is drawn from torch's generator on x's device, ``torch.empty_like(x).bernoulli_(1 - p)``: the draw
    torch's own CPU dropout makes, so under one seed a CPU forward equals F.dropout's.  Each forward under the
    same RNG state draws the same mask (gradcheck relies on it).

    ``mask``: the scaled mask (x's shape and dtype, values 0 or 1/(1-p); zeros when p = 1) of the last
    training-mode forward, or None after an identity forward (eval, p = 0).  ``inplace=True`` writes the
    output into x, as nn.Dropout(inplace=True) does.  The backward reads the mask and nothing else: changing
    ``mask`` in place before backward is refused (layers/saved.py); x and the output are not kept.
    Written in the template (layers/template.py): the base checks the input and dout and keeps the mask.
    """

    torch_class = torch.nn.Dropout
    _ctor_args = ("p", "inplace")
    _saved_labels = {"mask": "its mask (layer.mask)"}

    class Saved(NamedTuple):
        mask: Tensor | None  # x's shape, 0 or 1/(1-p); None: the forward was the identity

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        self.p = check_probability("Dropout", "p (the probability of an element being zeroed)", p)
        self.inplace = check_bool("Dropout", "inplace", inplace)
        self.mask: Tensor | None = None  # the last mask drawn (None after an identity forward)
        self.generator: torch.Generator | None = None  # where masks are drawn from (None: torch's default)
        # Data parallelism: (lo, hi, total) draws the mask of the whole global batch of `total` rows and keeps rows
        # [lo, hi), this process's part, so N processes drop exactly what one process would.
        self.global_rows: tuple[int, int, int] | None = None

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"

    def forward_math(self, x: Tensor):
        """x: any shape -> out: same shape."""
        if not self.training or self.p == 0.0:
            mask, out = None, x
        else:
            if self.p == 1.0:
                mask = torch.zeros_like(x)  # (N, ...)
            else:
                mask = draw_mask(
                    x, self.p, generator=self.generator, global_rows=self.global_rows
                )  # (N, ...) 0 or 1/(1-p)
            out = x.mul_(mask) if self.inplace else x * mask  # (N, ...)
        self.mask = mask
        return out, self.Saved(mask)

    def backward_math(self, dout: Tensor, saved: Saved) -> Tensor:
        """dout: shape of out -> dx = dout * mask (the forward's mask), or dout for an identity forward."""
        return dout if saved.mask is None else dout * saved.mask


def draw_mask(
    x: Tensor, p: float, *, generator: torch.Generator | None = None, global_rows: tuple[int, int, int] | None = None
) -> Tensor:
    """The scaled dropout mask for x: bernoulli(1 - p) / (1 - p), x's shape, dtype and device (0 <= p < 1).

    ``global_rows=(lo, hi, total)``: x holds rows [lo, hi) of a batch of ``total``; the whole batch's mask is
    drawn and these rows kept.
    """
    if global_rows is None:
        return torch.empty_like(x).bernoulli_(1.0 - p, generator=generator).div_(1.0 - p)
    lo, hi, total = global_rows
    if hi - lo != x.shape[0]:
        raise ValueError(f"Dropout: global_rows {global_rows} covers {hi - lo} rows, the input has {x.shape[0]}")
    full = x.new_empty((total, *x.shape[1:])).bernoulli_(1.0 - p, generator=generator).div_(1.0 - p)
    return full[lo:hi]


class SeededDropout(torch.nn.Dropout):
    """nn.Dropout drawing its masks as ``layers.Dropout`` does, from ``generator``: give a hand-written model and
    its twin generators in the same state and both drop the same elements, in any order of running them.
    Autograd differentiates ``x * mask``, so its backward reuses the mask as nn.Dropout's does."""

    generator: torch.Generator | None = None
    global_rows: tuple[int, int, int] | None = None

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:
            return x * 0.0
        return x * draw_mask(x, self.p, generator=self.generator, global_rows=self.global_rows)


def inter_layer_mask(
    out: Tensor, p: float, *, generator: torch.Generator | None = None, global_rows: tuple[int, int, int] | None = None
) -> Tensor:
    """The scaled dropout mask (values 0 or 1/(1-p)) for a layer's output ``out`` (T, N, F), time-major.

    Drawn batch-major, as an (N, T, F) block, whatever the layout: so the twin (models/seeded_recurrent.py) draws
    the same mask for batch_first=True and False, and under data parallelism ``global_rows=(lo, hi, total)``
    picks this process's rows of the global batch, as for every other dropout layer.
    """
    T, N, F = out.shape
    if p == 1.0:
        return out.new_zeros(T, N, F)
    mask = draw_mask(out.new_empty(N, T, F), p, generator=generator, global_rows=global_rows)  # (N, T, F)
    return mask.transpose(0, 1)  # (T, N, F), a view
