"""A run under torchrun: join the process group, pick this rank's device, stop every rank loudly on a failure.

``under_torchrun(device, timeout_s)`` is a context manager around a whole run.  Outside torchrun it yields
``SINGLE`` (one process, nothing changes).  Under torchrun it joins the process group (gloo on the CPU,
NCCL with cuda:LOCAL_RANK), and on the way out leaves it.  An exception on one rank is recorded in the
rendezvous store before that rank exits; a rank whose collective then fails reports which rank failed and why,
so a broken run ends within the process group's timeout with a message naming the rank, never a silent hang.
A peer that died without a word (killed), stopped answering within ``--dist-timeout`` or never joined is named
too: every rank's last word is one line (PeerFailed, exit 1), not a traceback of the collective that failed.
"""

from __future__ import annotations

import contextlib
import re

import torch
import torch.distributed as dist

from ..errors import RunFailed, UsageError
from .distributed import (
    SINGLE,
    DistInfo,
    failed_peer,
    init_from_env,
    report_failure,
    shutdown,
    silent_ranks,
    torchrun_env,
)

# How gloo, NCCL and the stores word a peer that stopped answering, or went away.
_TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_CLOSED = re.compile(r"connection (closed|reset|refused)|closed by peer|broken pipe|connectFullMesh", re.IGNORECASE)


class PeerFailed(RunFailed):
    """Another rank failed: this one stops too, naming it."""


@contextlib.contextmanager
def under_torchrun(
    device: torch.device, timeout_s: float = 120.0, init_method: str | None = None, info: DistInfo | None = None
):
    """-> (DistInfo, the device this rank trains on)."""
    info = info or torchrun_env()
    if info is None:  # not launched by torchrun (torchrun with one process still gets a group of one)
        yield SINGLE, device
        return
    if device.type == "cuda" and torch.cuda.device_count() <= info.local_rank:
        raise UsageError(
            f"rank {info.rank}: LOCAL_RANK {info.local_rank} needs cuda:{info.local_rank}, but there "
            f"are {torch.cuda.device_count()} CUDA devices here"
        )
    try:
        try:
            info, cuda = init_from_env(device.type, timeout_s=timeout_s, init_method=init_method, info=info)
        except (RuntimeError, ValueError, OSError) as e:  # the group never formed
            if _is_communication(e):  # a peer failed, died or never came
                raise PeerFailed(_explain(info, e, timeout_s, joining=True)) from None
            report_failure(info, e)  # this rank's own failure: the others are told who stopped them
            raise RunFailed(f"rank {info.rank} could not join the process group: {_first_line(e)}") from None
        try:
            yield info, (cuda or device)
        except (KeyboardInterrupt, SystemExit):
            raise
        except (UsageError, RunFailed) as e:  # this rank's own one-line failure: tell the others, then stop
            report_failure(info, e)
            raise
        except Exception as e:
            peer = failed_peer()
            if peer is not None and not peer.startswith(f"rank {info.rank}:"):
                raise PeerFailed(f"rank {info.rank} stopped because {peer}") from None
            if _is_communication(e):
                raise PeerFailed(_explain(info, e, timeout_s)) from None
            report_failure(info, e)
            raise
    finally:
        shutdown()


def _is_communication(e: BaseException) -> bool:
    """A collective or the store failed (not a bug in this rank's own computation)."""
    return isinstance(e, dist.DistError) or bool(_TIMED_OUT.search(str(e)) or _CLOSED.search(str(e)))


def _explain(info: DistInfo, e: BaseException, timeout_s: float, joining: bool = False) -> str:
    """This rank's last word on a failed collective or start-up: which rank, and what happened to it."""
    peer = failed_peer()
    if peer is not None and not peer.startswith(f"rank {info.rank}:"):
        return f"rank {info.rank} stopped because {peer}"
    silent = silent_ranks(info)
    who = ("rank " if len(silent) == 1 else "ranks ") + ", ".join(map(str, silent))
    text = str(e).strip()
    if joining and _TIMED_OUT.search(text):
        return (
            f"rank {info.rank} stopped: {who} did not join within --dist-timeout {timeout_s:g} s (never started, "
            f"or cannot reach the rendezvous)"
        )
    if _TIMED_OUT.search(text):
        return (
            f"rank {info.rank} stopped: {who} did not answer within --dist-timeout {timeout_s:g} s (stopped, "
            f"hung, or slower than the timeout allows)"
        )
    if _CLOSED.search(text):
        return f"rank {info.rank} stopped: {who} closed its connection without a word (killed, or crashed)"
    return f"rank {info.rank} stopped: {'joining the process group: ' if joining else ''}{_first_line(e)}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"
