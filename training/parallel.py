"""A run under torchrun: join the process group, pick this rank's device, stop every rank loudly on a failure.

``under_torchrun(device, timeout_s)`` is a context manager around a whole run.  Outside torchrun it yields
``SINGLE`` (one process, nothing changes).  Under torchrun it joins the process group (gloo on the CPU,
NCCL with cuda:LOCAL_RANK), and on the way out leaves it.  An exception on one rank is recorded in the
rendezvous store before that rank exits; a rank whose collective then fails reports which rank failed and why,
so a broken run ends within the process group's timeout with a message naming the rank, never a silent hang.
"""
from __future__ import annotations

import contextlib

import torch

from .distributed import SINGLE, DistInfo, failed_peer, init_from_env, report_failure, shutdown, torchrun_env
from .errors import UsageError


class PeerFailed(RuntimeError):
    """Another rank failed: this one stops too, naming it."""


@contextlib.contextmanager
def under_torchrun(device: torch.device, timeout_s: float = 120.0, init_method: str | None = None,
                   info: DistInfo | None = None):
    """-> (DistInfo, the device this rank trains on)."""
    info = info or torchrun_env()
    if info is None:  # not launched by torchrun (torchrun with one process still gets a group of one)
        yield SINGLE, device
        return
    if device.type == "cuda" and torch.cuda.device_count() <= info.local_rank:
        raise UsageError(f"rank {info.rank}: LOCAL_RANK {info.local_rank} needs cuda:{info.local_rank}, but there "
                         f"are {torch.cuda.device_count()} CUDA devices here")
    info, cuda = init_from_env(device.type, timeout_s=timeout_s, init_method=init_method, info=info)
    try:
        yield info, (cuda or device)
    except (KeyboardInterrupt, SystemExit):
        raise
    except UsageError as e:
        report_failure(info, e)
        raise
    except Exception as e:
        peer = failed_peer()
        if peer is not None and not peer.startswith(f"rank {info.rank}:"):
            raise PeerFailed(f"rank {info.rank} stopped because {peer}") from e
        report_failure(info, e)
        raise
    finally:
        shutdown()

