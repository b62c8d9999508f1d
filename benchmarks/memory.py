"""Peak tensor memory of one call, the benchmarks' shared measure (imported by the sibling scripts).

On CUDA: ``torch.cuda.max_memory_allocated`` above what was allocated before the call.  On the CPU torch keeps no
allocator statistics, and the resident set says little (freed memory is reused or kept by malloc), so the
call runs once under ``torch.profiler`` with memory profiling and the peak of the allocations it made and had
not yet freed is read from the profiler's memory timeline (every tensor allocation and free the call made,
autograd's saved tensors included; a tensor that existed before the call counts from the first operation of
the call that touches it: weights, gradients and optimizer state that the call reads or writes are in the
figure, measured: a call that only adds 1 to an existing 4 MB tensor peaks at 4 MB).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def peak_mb(fn: Callable[[], object], device: torch.device) -> float:
    """MB of tensor memory ``fn()`` held at its peak, beyond what was allocated before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline  # the timeline behind export_memory_timeline

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    return max((sum(s) for s in sizes), default=0) / 2**20
