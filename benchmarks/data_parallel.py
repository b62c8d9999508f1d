"""Data-parallel throughput on this machine: 1 vs N gloo processes, the share of a step spent communicating,
and the bucketed all-reduce overlapped with the backward vs started after it.

    python benchmarks/data_parallel.py                       # default net, global batch 512, 1 and 2 processes
    python benchmarks/data_parallel.py --hidden 128 --batch-size 256 --world 2 --steps 30

Every configuration trains the hand-written Net with SGD on random data, the global batch split between the
processes (as train.py does under torchrun); torch's intra-op threads (--threads, default one per core)
are divided between the processes, so 1 and N processes use the same cores.  A step's communication time
is measured by running the same all-reduces alone, on gradients already computed.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import timing  # a sibling script: benchmarks/ is sys.path[0] when a script here runs
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from losses import CrossEntropyLoss
from models import Net
from optimizers import SGD
from training.parallel.allreduce import GradBuckets
from training.parallel.distributed import DistInfo, init_from_env, shard_bounds, shutdown


def threads(a, world: int) -> int:
    """Each of ``world`` processes' share of the threads one process gets: the same cores for 1 and N."""
    return max(1, (a.threads or os.cpu_count() or 1) // world)


def worker(rank, world, tmp, a, mode, results):
    torch.set_num_threads(threads(a, world))
    info = DistInfo(rank, world, rank)
    if world > 1:
        init_from_env("cpu", timeout_s=120, init_method=f"file://{tmp}/rendezvous-{mode}", info=info)
    torch.manual_seed(0)
    net = Net(hidden_size=a.hidden, depth=a.depth)
    opt, crit = SGD(net.parameters(), lr=1e-3, momentum=0.9), CrossEntropyLoss(reduction="sum")
    buckets = None
    if world > 1:
        buckets = GradBuckets(net.parameters(), scale=1.0, bucket_cap_mb=a.bucket_mb)
        if mode == "overlap":
            buckets.attach(net)
    lo, hi = shard_bounds(a.batch_size, info)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(hi - lo, 784, generator=g), torch.randint(0, 10, (hi - lo,), generator=g)

    def step():
        opt.zero_grad()
        crit(net(x), y)
        net.backward(crit.backward(1.0 / a.batch_size))
        if buckets is not None:
            buckets.finish() if mode == "overlap" else buckets.reduce_all()
        opt.step()

    times, comm = [], []
    for i in range(a.warmup + a.steps):
        if world > 1:
            dist.barrier()
        t = time.perf_counter()
        step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
        if world > 1 and i >= a.warmup:  # the same all-reduces alone
            dist.barrier()
            t = time.perf_counter()
            for b in buckets.buckets:
                dist.all_reduce(b.buffer)
            comm.append(time.perf_counter() - t)
    results[(mode, world, rank)] = (statistics.median(times), statistics.median(comm) if comm else 0.0)
    if world > 1:
        shutdown()


def main(argv=None) -> int:
    ap = timing.parser(__doc__, device=False)
    ap.add_argument("--world", type=int, default=2, help="processes to compare with one")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=512, help="the global batch")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=4.0)
    a = ap.parse_args(argv)
    with mp.Manager() as manager, tempfile.TemporaryDirectory() as tmp:
        results = manager.dict()
        worker(0, 1, tmp, a, "single", results)
        for mode in ("after", "overlap"):
            mp.start_processes(
                worker, args=(a.world, tmp, a, mode, results), nprocs=a.world, start_method="spawn", join=True
            )
        results = dict(results)
    single = results[("single", 1, 0)][0]
    print(f"{timing.machine(torch.device('cpu'))} (1 process), {threads(a, a.world)} each ({a.world} processes)")
    print(
        f"Net hidden {a.hidden} x {a.depth}, global batch {a.batch_size}, SGD, "
        f"buckets of {a.bucket_mb} MB, median of {a.steps} steps"
    )
    print(f"{'configuration':<50}{'ms/step':>9}{'samples/s':>11}{'vs 1 proc':>11}{'comm share':>12}")
    print(f"{'1 process':<50}{single * 1e3:>9.1f}{a.batch_size / single:>11.0f}{1.0:>10.2f}x{'-':>12}")
    for mode, label in (("after", "all-reduce after the backward"), ("overlap", "buckets overlapping the backward")):
        t = max(results[(mode, a.world, r)][0] for r in range(a.world))  # the slowest rank sets the pace
        c = max(results[(mode, a.world, r)][1] for r in range(a.world))
        print(
            f"{f'{a.world} processes, {label}':<50}{t * 1e3:>9.1f}{a.batch_size / t:>11.0f}{single / t:>10.2f}x"
            f"{100 * c / t:>11.0f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
