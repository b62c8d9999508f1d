"""The fingerprint of a run's data: each array's shape, dtype and SHA-256, computed once when the data is loaded.

A checkpoint keeps the fingerprint of the data it was trained on, so resuming on other data (files replaced
under the same dataset name) is refused; under torchrun the ranks compare theirs before training.  It is
computed from whatever named tensors a dataset provides (MNIST's: the decompressed images and labels of each
split, before any normalisation), so it does not depend on how they were stored (.gz or not) or found.
"""

from __future__ import annotations

import hashlib

import torch


def fingerprint(arrays: dict[str, torch.Tensor]) -> dict[str, dict]:
    """name -> {"shape", "dtype", "sha256"} of each tensor (its bytes in memory order, on the CPU)."""
    out = {}
    for name, t in arrays.items():
        t = t.detach().cpu().contiguous()
        out[name] = {
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "sha256": hashlib.sha256(t.view(-1).view(torch.uint8).numpy()).hexdigest(),  # type: ignore[arg-type]
        }
    return out


def describe(entry: dict) -> str:
    """One array's fingerprint in a few words: 'uint8 (300, 28, 28) sha256 1f2e3d4c5b6a...'."""
    return f"{entry['dtype']} {tuple(entry['shape'])} sha256 {entry['sha256'][:12]}..."


def difference(a: dict, b: dict) -> str | None:
    """None if the fingerprints are equal; else the first array that differs, as 'name: <a> vs <b>'."""
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            left = describe(a[name]) if name in a else "absent"
            right = describe(b[name]) if name in b else "absent"
            return f"{name}: {left} vs {right}"
    return None
