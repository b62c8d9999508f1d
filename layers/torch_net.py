"""PytorchNet: the nn.Module twin of ``layers.Net``, trained with autograd."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .architecture import mlp_layers


class PytorchNet(nn.Module):
    """in_features -> [hidden_size -> ReLU] x depth -> num_classes, in an nn.Sequential named ``layers``.

    Same constructor arguments as ``Net``; under the same ``torch.manual_seed``
    both draw identical initial weights.  Inputs (N, 1, 28, 28) are flattened.
    """

    def __init__(self, hidden_size: int = 1024, num_classes: int = 10, in_features: int = 784, depth: int = 3,
                 *, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.layers = nn.Sequential(*mlp_layers(nn.Linear, nn.ReLU, hidden_size, num_classes, in_features, depth,
                                                device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x.flatten(1) if x.dim() > 2 else x)
