"""Flatten: merge a run of axes into one (a reshape); the backward reshapes dout back."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .checks import Expects, check_int
from .layer import BaseLayer


class Flatten(BaseLayer):
    """out = x with axes start_dim..end_dim merged: (N, C, H, W) -> (N, C*H*W) with the defaults.

    Backward: dx = dout reshaped to x's shape (flattening moves no number, so nothing else happens).
    Same arguments as torch.nn.Flatten; negative dims count from the end.  Kept: x's shape (no tensor, so
    nothing an in-place change could alter).
    """

    torch_class = torch.nn.Flatten
    _ctor_args = ("start_dim", "end_dim")
    expects = Expects(floating=False)  # any tensor: flattening moves no number

    class Saved(NamedTuple):
        shape: torch.Size  # x's shape, given back to dx

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        self.start_dim = check_int("Flatten", "start_dim", start_dim, lo=None)  # negative: counted from the end
        self.end_dim = check_int("Flatten", "end_dim", end_dim, lo=None)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"

    def forward_math(self, x: Tensor):
        """x: (d0, ..., d_{k-1}) -> out: the axes start_dim..end_dim merged into one."""
        nd = max(x.dim(), 1)  # a 0-d tensor flattens to (1,), as in torch
        start, end = (
            self.start_dim % nd if -nd <= self.start_dim < nd else None,
            self.end_dim % nd if -nd <= self.end_dim < nd else None,
        )
        if start is None or end is None or start > end:
            raise ValueError(
                f"{self!r}: start_dim and end_dim must name axes of the input, start_dim first; "
                f"got an input of shape {tuple(x.shape)}"
            )
        return x.flatten(start, end), self.Saved(x.shape)

    def backward_math(self, dout: Tensor, saved: Saved) -> Tensor:
        """dout: out's shape -> dx: x's shape."""
        return dout.reshape(saved.shape)
