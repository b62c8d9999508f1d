"""An exclusive lock on a folder for the life of a process: ``fcntl.flock`` on ``FOLDER/.lock``.

The operating system releases a flock when the process holding it ends, however it ends (SIGKILL included), so
a lock is never stale.  The file holds a line naming its holder (pid, host, command), which a refused process
quotes.  The file itself stays: removing it while another process waits on it would let two processes hold
"the" lock on two different files.  flock is advisory (it binds processes that ask for it) and local to one
machine's view of the file system (network file systems may not honour it).
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from ..errors import UsageError

NAME = ".lock"


class FolderBusy(UsageError):
    """Another process holds the folder's lock."""


class FolderLock:
    """``with FolderLock(folder):`` or ``acquire()`` / ``release()``; the folder must exist."""

    def __init__(self, folder: Path, what: str = "folder"):
        self.folder, self.what = Path(folder), what
        self.fd: int | None = None

    def acquire(self) -> FolderLock:
        """Take the lock without waiting; FolderBusy names the folder and the process holding it."""
        if self.fd is not None:
            return self
        path = self.folder / NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderBusy(
                f"{self.what} {self.folder} is in use by another run ({_holder(path)}); wait for it to "
                f"end, or pick another folder"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(path: Path, wait_s: float = 1.0) -> str:
    """The holder's line; the holder writes it just after it takes the lock, so wait briefly for it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            line = path.read_text().strip()
        except OSError:
            line = ""
        if line or time.monotonic() > deadline:
            return line or "a process that has not written its name yet"
        time.sleep(0.01)
