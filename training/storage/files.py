"""Atomic writes: the one way training writes a file, so a crash, Ctrl-C or a full disk never leaves half of one."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


class WriteFailed(OSError):
    """Writing a file failed (a full disk, most often); ``str()`` is one line saying which file, why, and what
    is left of the file that was there before."""

    def __init__(self, path: Path, error: OSError, after: str | None = None):
        super().__init__(error.errno, error.strerror or str(error), str(path))
        self.after = after

    def __str__(self) -> str:
        full = " (the disk is full)" if self.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        return f"cannot write {self.filename}: {self.strerror}{full}" + (f"; {self.after}" if self.after else "")


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(f)`` on a temporary file beside ``path``, fsync it, rename it over ``path``, fsync the folder.

    Readers see the old file or the new one, never a mix; the temporary file is removed on any error (a process
    killed during the write leaves ``.NAME.tmpPID``, which training/storage/output.py removes at the next run's start).
    An OSError while writing becomes WriteFailed.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        try:
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise WriteFailed(path, e, f"the previous {path.name} there is intact" if path.exists() else None) from e
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # make the rename itself durable
        finally:
            os.close(dir_fd)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())
