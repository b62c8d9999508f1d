"""Data augmentation for image batches, drawn from a given generator so every implementation sees the same.

``flip_and_shift(x, gen, pad)``: each image is mirrored left-right with probability 1/2 and translated by up
to ``pad`` pixels in each direction (zero padding in normalised units: the background value), per sample.
All on x's device: the random draws come from ``gen`` (a generator on that device), no host transfer.
"""

from __future__ import annotations

import torch
from torch import Tensor


def flip_and_shift(x: Tensor, gen: torch.Generator, pad: int = 2, fill: float = 0.0) -> Tensor:
    """x: (N, C, H, W) -> (N, C, H, W), a new tensor."""
    if x.dim() != 4:
        raise ValueError(f"flip_and_shift: expected images (N, C, H, W), got shape {tuple(x.shape)}")
    n, c, h, w = x.shape
    flip = torch.rand(n, generator=gen, device=x.device) < 0.5  # (N,)
    x = torch.where(flip.view(n, 1, 1, 1), x.flip(3), x)  # (N, C, H, W)
    if pad == 0:
        return x
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad), value=fill)  # (N, C, H+2p, W+2p)
    dy, dx = torch.randint(0, 2 * pad + 1, (2, n), generator=gen, device=x.device)  # (N,), (N,)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]  # (N, 1, H, 1)
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # (N, 1, 1, W)
    batch = torch.arange(n, device=x.device)[:, None, None, None]  # (N, 1, 1, 1)
    chan = torch.arange(c, device=x.device)[None, :, None, None]  # (1, C, 1, 1)
    return padded[batch, chan, rows, cols]  # (N, C, H, W)
