"""Share of an epoch spent on data handling: the seeded permutation and the batch gathers, vs training steps.

    python benchmarks/data.py --dataset fashion-mnist [--device cuda] [--threads 1]

train.py holds the whole split on the device and draws each batch by indexing it with a
slice of a permutation; this measures that against the hand-written Net's training steps
over the same epoch (default net, batch 128, Adam), and prints the one-time load time too.
The training epoch takes as long as one of train.py's (tens of seconds on a CPU): a progress
bar shows it going.
"""

from __future__ import annotations

import sys
import time

import timing  # a sibling script: benchmarks/ is sys.path[0] when a script here runs
import torch
from tqdm import tqdm

import training


def main(argv=None) -> int:
    ap = timing.parser(__doc__)
    ap.add_argument("--dataset", default="fashion-mnist", choices=list(training.DATASETS))
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--batch-size", type=int, default=128)
    a = ap.parse_args(argv)
    config = training.TrainConfig(
        dataset=a.dataset, data_dir=a.data_dir, batch_size=a.batch_size, val_split=0, impl="manual", quiet=True
    )
    device = a.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"{timing.machine(device)}\n{a.dataset}: loading ...", flush=True)
    t0 = time.perf_counter()
    try:
        data = training.load_data(config.data, device, torch.float32, say=lambda *x: None)
    except training.UsageError as e:
        print(e, file=sys.stderr)
        return 2
    load = time.perf_counter() - t0
    models = training.build_models(config.model, config.run, device, torch.float32)
    impl = training.build_impls(models, config.optim, config.run, device)["manual"]
    n, bs = data.train_x.shape[0], config.data.batch_size
    gen = torch.Generator().manual_seed(0)

    def gather_epoch():  # milliseconds: no progress bar to time along with it
        perm = torch.randperm(n, generator=gen).to(device)
        for i in range(0, n, bs):
            idx = perm[i : i + bs]
            data.train_x[idx], data.train_y[idx]

    def train_epoch():
        perm = torch.randperm(n, generator=gen).to(device)
        with tqdm(total=-(-n // bs), desc="one epoch of training steps", leave=False, file=sys.stderr) as bar:
            for i in range(0, n, bs):
                idx = perm[i : i + bs]
                impl.train_step(data.train_x[idx], data.train_y[idx], idx.shape[0])  # train.py reads back every 50
                bar.update(1)

    times = {}
    for name, fn in (("gather", gather_epoch), ("train", train_epoch), ("gather", gather_epoch)):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times[name] = min(times.get(name, float("inf")), time.perf_counter() - t)
    print(
        f"{a.dataset} on {device}: one-time load {load:.2f} s; per epoch ({n} samples, batch {bs}): "
        f"data handling {times['gather'] * 1e3:.1f} ms, training steps {times['train']:.2f} s "
        f"-> data handling is {100 * times['gather'] / times['train']:.2f}% of the epoch"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
