"""The configuration's data part (DataConfig): what a run trains on, and how it is cut into batches and
splits; --val-split's forms and their parser."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from layers.checks import is_a

from ..errors import UsageError
from .choices import DATASETS, TEXT_DATASETS
from .setting import check_part, per_model, setting

VAL_SPLIT_FORMS = "a count of samples (6000), a fraction in [0, 1) (0.1) or a percentage below 100% (10%)"


def parse_val_split(text: str) -> int | float:
    """--val-split's text: "6000" (a count of samples), "0.1" (a fraction) or "10%" (a percentage, read as the
    fraction 0.1).  ValueError naming the forms it takes."""
    try:
        if text.endswith("%"):
            percent = Fraction(text[:-1])
            if not 0 <= percent < 100:
                raise ValueError
            return float(percent / 100)
        if text.strip().lstrip("+-").isdigit():
            return int(text)
        return float(text)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"invalid value {text!r}: give {VAL_SPLIT_FORMS}") from None


@dataclass(frozen=True)
class DataConfig:
    """What a run trains on, and how it is cut into batches and splits."""

    dataset: str = setting(
        per_model(image="fashion-mnist", text="shakespeare"),
        "{image} (the default for the image models): from --data-dir, else Debian's dataset-fashion-mnist package "
        "(the README's install), else downloaded; mnist: from --data-dir, else downloaded; {text} (the default for "
        "the language models): the corpus shipped in training/tasks/corpora",
        choices=(*DATASETS, *TEXT_DATASETS),
        keeps="math",
    )
    data_file: Path | None = setting(
        None, "text runs: train on this UTF-8 file instead", type=Path, metavar="PATH", applies=("text",)
    )
    data_dir: Path = setting(
        Path("data"),
        "torchvision's layout, DIR/MNIST/raw and DIR/FashionMNIST/raw; files found "
        "elsewhere are decompressed into it (default: data, in the current folder)",
        type=Path,
        local=True,
        applies=("image",),
    )
    download: bool = setting(
        True, "never try the network for missing files", type=bool, form="negated", local=True, applies=("image",)
    )
    batch_size: int = setting(
        per_model(image=128, text=12),
        "samples per step, under torchrun the global batch (default: {image} images, {text} windows of text)",
        type=int,
        low=1,
        keeps="math",
    )
    augment: bool = setting(
        False,
        "random left-right flips and 2-pixel shifts of training images",
        type=bool,
        form="switch",
        keeps="math",
        applies=("image",),
    )
    val_split: int | float | None = setting(
        None,
        "training samples held out for validation: a count (6000), a fraction (0.1) or a percentage (10%%) of "
        "them (default: 10%%; 0: none)",
        type=(int, float),
        parse=parse_val_split,
        metavar="N|FRACTION|PERCENT",
        keeps="math",
        applies=("image",),
    )
    limit_train: int | None = setting(
        None,
        "use the first N training samples (default: all)",
        type=int,
        low=1,
        metavar="N",
        keeps="math",
        applies=("image",),
    )

    def __post_init__(self):
        check_part(self)
        value = self.val_split
        if value is None:
            return
        if not is_a(value, (int, float)):
            raise UsageError(f"--val-split must be {VAL_SPLIT_FORMS}, got {value!r}")
        if isinstance(value, int) and value < 0:
            raise UsageError(f"--val-split {value} is out of range (a count of samples is at least 0)")
        if isinstance(value, float) and not 0 <= value < 1:
            raise UsageError(
                f"--val-split {value} is out of range (a fraction must be in [0, 1); for a count of "
                f"samples give an integer, such as 6000)"
            )

    def val_count(self, n: int) -> int:
        """How many of ``n`` training samples --val-split holds out: a count as given, a fraction of n rounded down
        (0.41 of 300 is 123: the fraction is read as the decimal written, not as 0.41's binary approximation, whose
        product with 300 is 122.99999999999999), 10% rounded down by default."""
        if self.val_split is None:
            return n // 10
        if isinstance(self.val_split, int):
            return self.val_split
        return math.floor(Fraction(repr(self.val_split)) * n)
