"""A small image task for ``python -m learn train``: the first Fashion-MNIST images, downsized, or a built-in task.

Fashion-MNIST is read where Debian's ``dataset-fashion-mnist`` installs it, or from ``./data/FashionMNIST/raw``
(torchvision's layout), only the first images of the training split (the gzip stream is read no further).
Without it, a built-in task stands in: ten classes, each a fixed random 14 x 14 pattern plus noise.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import torch
from torch import Tensor

PLACES = [Path("/usr/share/datasets/fashion-mnist"), Path("data/FashionMNIST/raw")]
IMAGES, LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"


def _open(folder: Path, name: str):
    for path in (folder / f"{name}.gz", folder / name):
        if path.is_file():
            return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    return None


def _read_idx(f, n: int, header: int) -> tuple[tuple[int, ...], bytes]:
    magic = f.read(4)
    dims = struct.unpack(f">{magic[3]}I", f.read(4 * magic[3]))
    if magic[:2] != b"\0\0" or len(dims) != header:
        raise ValueError("not an IDX file of the expected kind")
    count = min(n, dims[0])
    size = count
    for d in dims[1:]:
        size *= d
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated")
    return (count, *dims[1:]), data


def fashion_mnist(n: int) -> tuple[Tensor, Tensor, str] | None:
    """The first ``n`` training images (n, 1, 28, 28) in [0, 1] and labels (n,), or None when not installed."""
    for folder in PLACES:
        fi, fl = _open(folder, IMAGES), _open(folder, LABELS)
        if fi is None or fl is None:
            continue
        try:
            with fi, fl:
                shape, pixels = _read_idx(fi, n, 3)
                _, labels = _read_idx(fl, shape[0], 1)
        except (OSError, EOFError, ValueError, struct.error):
            continue
        x = torch.frombuffer(bytearray(pixels), dtype=torch.uint8).reshape(shape[0], 1, 28, 28)
        y = torch.frombuffer(bytearray(labels), dtype=torch.uint8).long()
        return x.double() / 255, y, f"Fashion-MNIST ({folder}), its first {shape[0]} training images"
    return None


def small_task(n: int = 1024, seed: int = 0) -> tuple[Tensor, Tensor, str]:
    """Images (n, 1, 14, 14) float64, standardised, and labels (n,) in 0..9, with a line saying what they are."""
    found = fashion_mnist(n)
    if found is not None:
        x, y, what = found
        x = torch.nn.functional.avg_pool2d(x, 2)  # 28 x 28 -> 14 x 14: a smaller network, a faster run
        what += ", averaged down to 14 x 14"
    else:
        g = torch.Generator().manual_seed(seed)
        patterns = torch.randn(10, 1, 14, 14, generator=g, dtype=torch.float64)
        y = torch.randint(0, 10, (n,), generator=g)
        x = patterns[y] + 1.5 * torch.randn(n, 1, 14, 14, generator=g, dtype=torch.float64)
        what = (
            "a built-in task (Fashion-MNIST not found: apt-get install dataset-fashion-mnist): ten classes, each "
            "a random 14 x 14 pattern plus noise"
        )
    x = (x - x.mean()) / x.std()
    return x, y, what
