"""The data: find (or fetch) MNIST / Fashion-MNIST IDX files, read them, normalise, hold them on the device.

Search order for each split: the files already in torchvision's raw folder (decompressing .gz beside them),
Debian's ``dataset-fashion-mnist`` package, then torchvision's download.  Everything is loaded once; a
training batch is an index into tensors that already live on the device.
"""

from __future__ import annotations

import gzip
import hashlib
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..config.choices import DATASETS
from ..config.data import DataConfig
from ..errors import UsageError
from ..storage.files import atomic_write_bytes
from ..storage.fingerprint import fingerprint

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")
SPLIT_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# Debian's dataset-fashion-mnist (0.0~git20200523.55506a9-1) recompressed the official files: the contents are
# the same, the .gz bytes (and so their MD5s) are not the ones torchvision lists.
DEBIAN_MD5 = {
    "train-images-idx3-ubyte.gz": "cf8536b0aa1a6ac5fa3f23001093305c",
    "train-labels-idx1-ubyte.gz": "10bea18fdb374794d4bb42e356e600c9",
    "t10k-images-idx3-ubyte.gz": "f78720b4224f21cce2f2ccf2d7a94c9a",
    "t10k-labels-idx1-ubyte.gz": "0d30e22e447f3c33dab9ed536400ac01",
}


@dataclass
class Data:
    train_x: Tensor  # (N, *sample_shape) normalised with the training split's mean and std, on the device
    train_y: Tensor  # (N,) int64
    val_x: Tensor | None
    val_y: Tensor | None
    test_x: Tensor
    test_y: Tensor
    background: float = 0.0  # a black pixel after normalisation (what augmentation pads with)
    fingerprint: dict = field(default_factory=dict)  # of the arrays read (training/storage/fingerprint.py)


def torchvision_class(dataset: str):
    """The torchvision dataset class for a name in DATASETS (MNIST or FashionMNIST)."""
    from torchvision import datasets

    return getattr(datasets, DATASETS[dataset])


def known_md5(dataset: str) -> dict[str, set[str]]:
    """.gz name -> every MD5 we know for it: torchvision's list, and Debian's for Fashion-MNIST."""
    known = {name: {md5} for name, md5 in torchvision_class(dataset).resources}
    if dataset == "fashion-mnist":
        for name, md5 in DEBIAN_MD5.items():
            known.setdefault(name, set()).add(md5)
    return known


def _missing_data_message(dataset: str, raw: Path, looked: list[Path], reason: str) -> str:
    names = ", ".join(f for pair in SPLIT_FILES.values() for f in pair)
    lines = [f"error: no usable {dataset} data: {reason}", "looked in:"] + [f"  {p}" for p in looked]
    lines += [f"fix: put the four IDX files ({names}; .gz or decompressed) in {raw}/"]
    lines += [
        "     or train on Fashion-MNIST: apt-get install -y dataset-fashion-mnist && "
        "python train.py --dataset fashion-mnist"
    ]
    return "\n".join(lines)


def _one_line(e: Exception) -> str:
    """An exception in one line: torchvision's download error is "Error downloading F:" then, per mirror, "Tried
    URL, got:" and the cause; its first line and the last cause say what happened."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def check_data_dir(root: Path) -> None:
    """A --data-dir that exists must be a folder: say so in one line instead of failing deep inside."""
    if root.exists() and not root.is_dir():
        raise UsageError(f"--data-dir {root} is not a folder")


def prepare_raw(root: Path, dataset: str, train: bool, download: bool, say: Callable = print) -> Path:
    """Make the decompressed IDX files of one split present in torchvision's raw folder; return the folder.

    Raises UsageError naming every place it looked, or the path it could not write.
    """
    check_data_dir(root)
    raw = root / DATASETS[dataset] / "raw"
    looked = [raw]

    def have(name: str) -> bool:
        return (raw / name).is_file() or (raw / f"{name}.gz").is_file()

    def decompress(src: Path, dst: Path) -> int:
        """Write ``src``'s decompressed bytes to ``dst``; -> how many."""
        try:
            with gzip.open(src, "rb") as f:
                data = f.read()
        except (OSError, EOFError, zlib.error) as e:  # not gzip, truncated, bad CRC, damaged deflate data
            raise UsageError(
                _missing_data_message(dataset, raw, looked, f"{src} is not a readable gzip file ({e})")
            ) from e
        try:
            raw.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(dst, data)
        except OSError as e:
            raise UsageError(f"cannot write {dst}: {e.strerror or e}") from None
        return len(data)

    names = SPLIT_FILES[train]
    if not all(have(n) for n in names) and dataset == "fashion-mnist":
        looked.append(DEBIAN_FASHION)
        if all((DEBIAN_FASHION / f"{n}.gz").is_file() for n in names):
            written = sum(decompress(DEBIAN_FASHION / f"{n}.gz", raw / n) for n in names if not have(n))
            say(
                f"decompressed Debian's Fashion-MNIST {'training' if train else 'test'} split from {DEBIAN_FASHION} "
                f"into {raw} ({written / 1e6:.0f} MB; --data-dir chooses where)"
            )
    if not all(have(n) for n in names) and download:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torchvision_class(dataset)(str(root), train=train, download=True)
            looked.append(Path("the network (torchvision download)"))
        except Exception as e:  # no network, a refused mirror, a bad archive: all reported the same way
            looked.append(Path(f"the network (torchvision download: {_one_line(e)})"))
    missing = [n for n in names if not have(n)]
    if missing:
        raise UsageError(_missing_data_message(dataset, raw, looked, f"missing {', '.join(missing)}"))
    known = known_md5(dataset)
    for n in names:
        gz = raw / f"{n}.gz"
        if gz.is_file():
            md5 = hashlib.md5(gz.read_bytes()).hexdigest()
            if md5 not in known.get(gz.name, ()):
                warnings.warn(
                    f"{gz} has MD5 {md5}, not the official one (torchvision's or Debian's); using it anyway "
                    f"(its contents are checked when read)",
                    stacklevel=2,
                )
            if not (raw / n).is_file():
                decompress(gz, raw / n)
    return raw


def read_split(raw: Path, train: bool, dataset: str = "mnist") -> tuple[Tensor, Tensor]:
    """Read one split's images (N, 28, 28) uint8 and labels (N,) int64 with torchvision's IDX reader."""
    from torchvision.datasets.mnist import read_image_file, read_label_file

    img_name, lbl_name = SPLIT_FILES[train]
    out = []
    for name, reader in ((img_name, read_image_file), (lbl_name, read_label_file)):
        path = raw / name
        try:
            out.append(reader(str(path)))
        except (AssertionError, RuntimeError, ValueError, TypeError, IndexError, OSError) as e:
            raise UsageError(
                _missing_data_message(
                    dataset, raw, [raw], f"{path} is corrupt or truncated ({type(e).__name__}: {e or 'bad IDX header'})"
                )
            ) from None
    images, labels = out
    if images.shape[1:] != (28, 28) or images.shape[0] != labels.shape[0] or labels.numel() == 0:
        raise UsageError(
            _missing_data_message(
                dataset,
                raw,
                [raw],
                f"{raw / img_name} holds images of shape "
                f"{tuple(images.shape)} for {labels.shape[0]} labels; expected "
                f"(N, 28, 28) with N matching",
            )
        )
    if labels.min() < 0 or labels.max() > 9:
        raise UsageError(_missing_data_message(dataset, raw, [raw], f"{raw / lbl_name} has labels outside 0..9"))
    return images, labels


def load_data(
    settings: DataConfig,
    device: torch.device,
    dtype: torch.dtype,
    say: Callable = print,
    sample_shape: tuple[int, ...] = (784,),
    seed: int = 0,
) -> Data:
    """The whole dataset, normalised, on the device, loaded once; the validation split is drawn from ``seed``.

    ``sample_shape`` is (784,) for an MLP, (1, 28, 28) for a CNN.
    """
    train_raw = prepare_raw(settings.data_dir, settings.dataset, True, settings.download, say)
    test_raw = prepare_raw(settings.data_dir, settings.dataset, False, settings.download, say)
    x, y = read_split(train_raw, True, settings.dataset)
    tx, ty = read_split(test_raw, False, settings.dataset)
    arrays = fingerprint({"train_images": x, "train_labels": y, "test_images": tx, "test_labels": ty})
    if settings.limit_train is not None:
        x, y = x[: settings.limit_train], y[: settings.limit_train]
    n = x.shape[0]
    n_val = settings.val_count(n)
    if n_val >= n:
        raise UsageError(
            f"--val-split {settings.val_split} holds out {n_val} of the {n} training samples, leaving none to train on"
        )
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    val_idx, train_idx = order[:n_val], order[n_val:]
    train = x[train_idx].to(torch.float64) / 255
    mean, std = train.mean().item(), train.std().item()

    def prep(images: Tensor) -> Tensor:
        return ((images.reshape(images.shape[0], *sample_shape).to(torch.float64) / 255 - mean) / std).to(device, dtype)

    return Data(
        train_x=prep(x[train_idx]),
        train_y=y[train_idx].to(device),
        val_x=prep(x[val_idx]) if n_val else None,
        val_y=y[val_idx].to(device) if n_val else None,
        test_x=prep(tx),
        test_y=ty.to(device),
        background=-mean / std,
        fingerprint=arrays,
    )
