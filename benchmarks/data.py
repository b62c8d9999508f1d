"""Share of an epoch spent on data handling: the seeded permutation and the batch gathers, vs training steps.

    python benchmarks/data.py --dataset fashion-mnist [--device cuda]

train.py holds the whole split on the device and draws each batch by indexing it with a
slice of a permutation; this measures that against the hand-written Net's training steps
over the same epoch (default net, batch 128, Adam), and prints the one-time load time too.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

import training


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch-size", type=int, default=128)
    a = ap.parse_args(argv)
    config = training.TrainConfig(dataset=a.dataset, data_dir=a.data_dir, device=a.device, batch_size=a.batch_size,
                                  val_split=0, impl="manual", quiet=True)
    device = training.resolve_device(config.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    data = training.load_data(config, device, torch.float32, say=lambda *x: None)
    load = time.perf_counter() - t0
    impl = training.build_impls(config, device, torch.float32)["manual"]
    n, bs = data.train_x.shape[0], config.batch_size
    gen = torch.Generator().manual_seed(0)

    def gather_epoch():
        perm = torch.randperm(n, generator=gen).to(device)
        for i in range(0, n, bs):
            idx = perm[i:i + bs]
            data.train_x[idx], data.train_y[idx]

    def train_epoch():
        perm = torch.randperm(n, generator=gen).to(device)
        for i in range(0, n, bs):
            idx = perm[i:i + bs]
            impl.train_step(data.train_x[idx], data.train_y[idx], idx.shape[0])  # train.py reads losses back every 50 steps

    times = {}
    for name, fn in (("gather", gather_epoch), ("train", train_epoch), ("gather", gather_epoch)):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times[name] = min(times.get(name, float("inf")), time.perf_counter() - t)
    print(f"{a.dataset} on {device}: one-time load {load:.2f} s; per epoch ({n} samples, batch {bs}): "
          f"data handling {times['gather'] * 1e3:.1f} ms, training steps {times['train']:.2f} s "
          f"-> data handling is {100 * times['gather'] / times['train']:.2f}% of the epoch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
