"""Mean squared error with a hand-written gradient: dL/dx = 2 (x - y) / numel."""
from __future__ import annotations

from torch import Tensor

from layers.checks import check_floating, check_like, check_loss_dout, check_tensor
from ._reduction import check_reduction


class MSELoss:
    """``loss = crit(input, target)`` = mean (or sum) of (input - target)^2; ``crit.backward()`` -> dL/dinput.

    input and target must have the same shape (no silent broadcasting, unlike a
    mismatched torch call that only warns).

    Kept from forward to backward: input - target, its own tensor (no version check needed: changing input or
    target in place after the forward changes nothing here; torch.autograd, which keeps both, would refuse it).
    """

    def __init__(self, reduction: str = "mean"):
        self.reduction = check_reduction("MSELoss", reduction)
        self._cache: tuple[Tensor, float] | None = None

    def __repr__(self) -> str:
        return f"MSELoss(reduction={self.reduction!r})"

    def __call__(self, input: Tensor, target: Tensor) -> Tensor:
        return self.forward(input, target)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """input, target: same shape (*) -> loss, a 0-d tensor."""
        owner = repr(self)
        check_tensor(owner, "input", input)
        check_tensor(owner, "target", target)
        check_floating(owner, "input", input)
        if input.shape != target.shape:
            raise ValueError(f"{owner}: input has shape {tuple(input.shape)} but target has shape "
                             f"{tuple(target.shape)}; they must match")
        check_like(owner, "target", target, input, "input")
        if input.numel() == 0:
            raise ValueError(f"{owner}: input is empty")
        diff = input - target  # (*)
        scale = 1.0 / input.numel() if self.reduction == "mean" else 1.0
        self._cache = (diff, scale)
        return (diff * diff).sum() * scale

    def backward(self, dout: float | Tensor = 1.0) -> Tensor:
        """-> dL/dinput, the input's shape, times ``dout`` (default 1)."""
        if self._cache is None:
            raise RuntimeError(f"{self!r}: backward called before forward (or twice after one forward)")
        if not isinstance(dout, float):
            check_loss_dout(self, dout)
        diff, scale = self._cache
        self._cache = None
        return diff.mul_(2 * scale * dout)
