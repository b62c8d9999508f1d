"""--device: "auto" or a device name, checked to exist here."""

from __future__ import annotations

import torch

from .errors import UsageError


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; anything else is checked and must exist here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise UsageError(f"--device {name!r} is not a device ({e})") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {name}: only cpu and cuda are supported, not {device.type}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"--device {name} asked for CUDA, but torch {torch.__version__} sees no CUDA device here; use --device cpu"
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: there are only {torch.cuda.device_count()} CUDA devices here")
    return device
