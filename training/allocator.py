"""Keep freed memory in the process, so that a training step does not fault its activations back in.

torch allocates CPU tensors with malloc.  glibc's malloc hands a large block back to the system when it is
freed (at the end of the heap, once more than M_TRIM_THRESHOLD is free there; above M_MMAP_THRESHOLD, every
time) and both thresholds adapt to the sizes it has seen.  A training step frees all of its activations at the
end of backward and allocates the same sizes again at the next forward, so the memory can go back to the
system and return as fresh pages, each one a page fault the kernel must zero: measured on the default GPT
(benchmarks/gpt_step.py), about 8,000 faults per iteration, a quarter of the hand-written step's time, and a
number that depends on the order of earlier allocations.  PyTorch's CPU tuning guide answers this with another
allocator (jemalloc, tcmalloc); ``retain_freed_memory`` asks glibc itself, through ``mallopt``, to keep what
is freed (the CUDA caching allocator does the same for GPU memory).  The process then holds its peak heap
between steps instead of returning it.  Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed: blocks up to 32 MiB come from the heap and stay there
TRIM_THRESHOLD = 1 << 30  # the heap's free top is returned to the system only beyond 1 GiB


def retain_freed_memory() -> bool:
    """Tune glibc's malloc to keep freed blocks (process-wide); True if it took effect, False where there is no
    glibc (macOS, Windows, musl) or it refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success; setting either threshold also stops glibc adapting them
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
