"""PytorchNet: the nn.Module twin of ``models.Net``, trained with autograd."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .architecture import CLASSES, DEPTH, HIDDEN, IN_FEATURES, mlp_layers


class PytorchNet(nn.Module):
    """in_features -> [hidden_size -> ReLU] x depth -> num_classes, in an nn.Sequential named ``layers``.

    Same constructor arguments as ``Net`` (``layers=[...]`` takes torch.nn modules); under the
    same ``torch.manual_seed`` both draw identical initial weights.  Inputs (N, 1, 28, 28) are flattened.
    """

    def __init__(
        self,
        hidden_size: int = HIDDEN,
        num_classes: int = CLASSES,
        in_features: int = IN_FEATURES,
        depth: int = DEPTH,
        *,
        layers: Sequence[nn.Module] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if layers is None:
            layers = mlp_layers(
                nn.Linear, nn.ReLU, hidden_size, num_classes, in_features, depth, device=device, dtype=dtype
            )
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x.flatten(1) if x.dim() > 2 else x)
