"""Mean squared error with a hand-written gradient: dL/dx = 2 (x - y) / numel."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from layers.checks import check_floating, check_like, check_tensor

from ._reduction import check_reduction
from .loss import Loss


class MSELoss(Loss):
    """``loss = crit(input, target)`` = mean (or sum) of (input - target)^2; ``crit.backward()`` -> dL/dinput.

        loss = scale * sum (x - y)^2,   dL/dx = 2 scale (x - y),   scale = 1/numel for "mean", 1 for "sum"

    input and target must have the same shape (no silent broadcasting, unlike a
    mismatched torch call that only warns).

    Kept from forward to backward: x - y, its own tensor (changing input or target in place after the forward
    changes nothing here; torch.autograd, which keeps both, would refuse it).  Written in the template
    (losses/loss.py).
    """

    class Saved(NamedTuple):
        diff: Tensor  # (*) input - target; becomes dL/dinput in place
        scale: float  # 1/numel for "mean", 1 for "sum"

    def __init__(self, reduction: str = "mean"):
        self.reduction = check_reduction("MSELoss", reduction)

    def __repr__(self) -> str:
        return f"MSELoss(reduction={self.reduction!r})"

    def forward_math(self, input: Tensor, target: Tensor):
        """input, target: same shape (*) -> loss, a 0-d tensor."""
        diff = input - target  # (*)
        scale = 1.0 / input.numel() if self.reduction == "mean" else 1.0
        return (diff * diff).sum() * scale, self.Saved(diff, scale)

    def backward_math(self, dout: float | Tensor, saved: Saved) -> Tensor:
        """-> dL/dinput, the input's shape, times ``dout`` (default 1)."""
        return saved.diff.mul_(2 * saved.scale * dout)

    def check_input(self, input: object, target: object) -> None:
        if (
            isinstance(input, Tensor)
            and isinstance(target, Tensor)
            and input.shape == target.shape
            and input.dtype == target.dtype
            and input.is_floating_point()
            and input.device == target.device
            and input.numel()
        ):
            return
        owner = repr(self)  # the cheap test above failed: find out what is wrong and say so
        input = check_tensor(owner, "input", input)
        target = check_tensor(owner, "target", target)
        check_floating(owner, "input", input)
        if input.shape != target.shape:
            raise ValueError(
                f"{owner}: input has shape {tuple(input.shape)} but target has shape "
                f"{tuple(target.shape)}; they must match"
            )
        check_like(owner, "target", target, input, "input")
        if input.numel() == 0:
            raise ValueError(f"{owner}: input is empty")
