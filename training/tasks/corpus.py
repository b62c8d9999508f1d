"""Text for language models: a UTF-8 corpus as character ids, split 90/10, served as windows of block_size.

The corpus is ``--data-file PATH``, or for ``--dataset shakespeare`` the copy shipped in
``training/tasks/corpora/shakespeare/`` (with its README: the text's source and the credit it requires).  The
vocabulary is the sorted set of the corpus's characters (nanoGPT's shakespeare_char preparation); the first
90% of the characters train, the last 10% validate.  A training batch is ``batch_size`` windows at random
offsets, each target the window shifted by one character; an evaluation batch likewise, or with
``--eval-iters all`` every non-overlapping window of the split, a figure that does not depend on sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..errors import UsageError
from ..storage.fingerprint import fingerprint

CORPORA = {"shakespeare": Path(__file__).resolve().parent / "corpora" / "shakespeare" / "tragedies.txt"}
TRAIN_FRACTION = 0.9


@dataclass
class TextData:
    """A character-level corpus on the device: ``train``/``val`` are int64 ids (n,), ``vocab`` the characters."""

    source: str  # where the text came from (a path)
    vocab: list[str]
    train: Tensor
    val: Tensor
    fingerprint: dict  # of the corpus's bytes (training/storage/fingerprint.py): a resume on other text is refused

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Characters -> ids; a character outside the vocabulary is an error naming it."""
        index = {c: i for i, c in enumerate(self.vocab)}
        unknown = sorted({c for c in text if c not in index})
        if unknown:
            raise UsageError(
                f"the text has characters outside the model's vocabulary of {len(self.vocab)}: "
                f"{', '.join(repr(c) for c in unknown[:10])}{' ...' if len(unknown) > 10 else ''}"
            )
        return [index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.vocab[i] for i in ids)

    def split(self, name: str) -> Tensor:
        return self.train if name == "train" else self.val

    def batch(self, split: str, batch_size: int, block_size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """``batch_size`` windows at offsets drawn from ``gen`` (on the CPU, so a run is the same on every device)
        -> x (B, T) and y (B, T), y the next character of each position (nanoGPT's get_batch)."""
        data = self.split(split)
        offsets = torch.randint(data.shape[0] - block_size, (batch_size,), generator=gen).to(data.device)
        return self.windows_at(data, offsets, block_size)

    @staticmethod
    def windows_at(data: Tensor, offsets: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
        idx = offsets.view(-1, 1) + torch.arange(block_size + 1, device=data.device)  # (B, T+1)
        w = data[idx]  # one gather on the device
        return w[:, :-1], w[:, 1:]

    def all_windows(self, split: str, block_size: int) -> tuple[Tensor, Tensor]:
        """Every non-overlapping window of the split: x, y (n_windows, T); the split's tail shorter than a window
        is left out."""
        data = self.split(split)
        n = (data.shape[0] - 1) // block_size
        offsets = torch.arange(n, device=data.device) * block_size
        return self.windows_at(data, offsets, block_size)


def corpus_path(dataset: str, data_file: Path | None) -> Path:
    if data_file is not None:
        return Path(data_file)
    if dataset not in CORPORA:
        raise UsageError(
            f"--dataset {dataset}: no text corpus of that name; known: {', '.join(CORPORA)} "
            f"(or --data-file PATH for any UTF-8 text)"
        )
    return CORPORA[dataset]


def load_text(path: Path, block_size: int, device: torch.device | str = "cpu") -> TextData:
    """Read, check and encode a corpus; every way it can be unusable is one UsageError naming the file."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"--data-file {path}: cannot read it ({e.strerror or type(e).__name__})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(
            f"--data-file {path}: not UTF-8 text (byte {e.start}: {raw[e.start : e.start + 1]!r}); "
            f"convert it to UTF-8 first"
        ) from None
    if not text:
        raise UsageError(f"--data-file {path}: the file is empty")
    vocab = sorted(set(text))
    n_train = int(len(text) * TRAIN_FRACTION)
    need = block_size + 1  # one window and its next character
    if n_train < need or len(text) - n_train < need:
        raise UsageError(
            f"--data-file {path}: {len(text)} characters are too few for windows of --block-size "
            f"{block_size}: the training split ({n_train}) and the validation split "
            f"({len(text) - n_train}) each need at least {need}"
        )
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.int64)
    return TextData(
        source=str(path),
        vocab=vocab,
        train=ids[:n_train].to(device),
        val=ids[n_train:].to(device),
        fingerprint=fingerprint({"corpus": torch.frombuffer(bytearray(raw), dtype=torch.uint8)}),
    )
