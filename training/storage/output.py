"""A run's output folder: locked for the run's whole life, checked against what it already holds, and created
only once the run is sure to start.

``check()`` runs before any data is read and refuses what it can: a place that cannot be written, a folder
another run holds (training/storage/lock.py), a folder that holds another run.  A fresh run never writes over another
run's files: it is refused with the two ways on (``--resume`` continues that run, ``--overwrite`` replaces it).
``create()`` runs when the data is loaded and the models are built: it makes the folder (so a run refused for
missing data leaves no empty folder behind), takes the lock, removes the old run's files if ``--overwrite``
said so, and removes temporary files that a killed process's interrupted write left (files.atomic_write's
``.NAME.tmpPID``).  Rank 0 alone does any of this under torchrun.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import UsageError
from .lock import FolderLock

RUN_FILES = ("checkpoint.pt", "summary.json", "metrics.jsonl", "curves.png", "monitor_*.jsonl", "monitor_*.png")
LEFTOVER = re.compile(r"^\..+\.tmp\d+$")  # files.atomic_write's temporary file of an interrupted write


_given: set[Path] = set()  # default folders named by this process so far


def default_out(root: Path = Path("runs")) -> Path:
    """``runs/<date>-<time>-<pid>``, the folder of a run without ``--out``: two runs started in the same second are
    two processes, whose ids differ; a second run in the same process (a library caller) gets ``-2``, ``-3``, ...
    and a name whose folder exists already is passed over."""
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    n = 1
    while True:
        path = root / (stem if n == 1 else f"{stem}-{n}")
        if path not in _given and not path.exists():
            _given.add(path)
            return path
        n += 1


class OutputFolder:
    def __init__(self, path: Path, resume: Path | None = None, overwrite: bool = False):
        self.path, self.resume, self.overwrite = Path(path), resume, overwrite
        self.lock = FolderLock(self.path, "--out")
        if overwrite and resume is not None and self._continues_resume():
            raise UsageError(
                f"--overwrite would delete the checkpoint that --resume {resume} continues; drop "
                f"--overwrite to continue it in {self.path}, or pass another --out"
            )

    def check(self) -> None:
        """Refuse now what can be refused before the data is read.  An existing folder is locked here already."""
        if self.path.exists():
            self._claim()
            return
        parent = self.path.parent
        while not parent.exists():
            parent = parent.parent
        try:  # prove the place writable without leaving anything there
            Path(tempfile.mkdtemp(prefix=".write-test-", dir=parent)).rmdir()
        except OSError as e:
            raise UsageError(f"--out {self.path}: cannot write there ({_reason(e)})") from None

    def create(self, say: Callable = print) -> Path:
        """The run starts: make the folder, lock it, clear it of what --overwrite replaces and of leftovers."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--out {self.path}: cannot write there ({_reason(e)})") from None
        self._claim()
        if self.overwrite:
            old = self._run_files()
            for f in old:
                f.unlink()
            if old:
                say(f"--overwrite: removed the previous run's {', '.join(f.name for f in old)} from {self.path}")
        for f in self.path.iterdir():
            if LEFTOVER.match(f.name) and f.is_file():
                f.unlink()
                say(f"removed {f}, left by an interrupted write")
        return self.path

    def release(self) -> None:
        self.lock.release()

    def _claim(self) -> None:
        """Lock the folder (once), then refuse it if it holds another run this one would write over."""
        if not self.path.is_dir():
            raise UsageError(f"--out {self.path}: cannot write there (not a folder)")
        try:
            self.lock.acquire()
        except OSError as e:
            raise UsageError(f"--out {self.path}: cannot write there ({_reason(e)})") from None
        old = self._run_files()
        if old and not self.overwrite and not self._continues_resume():
            ckpt = self.path / "checkpoint.pt"
            way = f"continue it with --resume {ckpt}, " if ckpt.exists() else ""
            raise UsageError(
                f"--out {self.path} already holds a run ({', '.join(f.name for f in old)}); {way}replace "
                f"it with --overwrite, or pick another --out"
            )

    def _run_files(self) -> list[Path]:
        return sorted({f for pattern in RUN_FILES for f in self.path.glob(pattern) if f.is_file()})

    def _continues_resume(self) -> bool:
        """This folder is the one the resumed checkpoint lives in: its files are this run's own."""
        return self.resume is not None and self.resume.resolve().parent == self.path.resolve()


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__
