"""Median time of one Conv2d forward + backward: the kernels vs nn.Conv2d under autograd vs the textbook (im2col).

    PYTHONPATH=$PWD python benchmarks/conv.py                  # CPU, float32, batch 128
    PYTHONPATH=$PWD python benchmarks/conv.py --device cuda --repeats 100

Shapes are the typical MNIST / CIFAR convolutions.  A network's first convolution (its input is data)
computes no input gradient in either implementation (``need_input_grad=False`` / an input that does not
require grad); the others compute dx too.  Each step: forward, backward with a fixed random upstream
gradient, parameter gradients cleared to None first (as ``zero_grad()`` does).  The candidates run
interleaved, one step each per round, so drift in machine speed hits all alike.  Ratios:
"vs nn" = t_nn / t_hand and "im2col / fast" = t_im2col / t_hand (> 1: the kernels are faster than the textbook,
the layer's own backward run with ``kernels.disabled()``).
"""

from __future__ import annotations

import timing  # a sibling script: benchmarks/ is sys.path[0] when a script here runs
import torch
from timing import interleaved

import kernels
from layers import Conv2d

# (label, C_in, C_out, kernel, stride, padding, H = W, first layer of the network?)
SHAPES = [
    ("MNIST conv1 1->32 3x3 28x28", 1, 32, 3, 1, 1, 28, True),
    ("MNIST conv2 32->64 3x3 14x14", 32, 64, 3, 1, 1, 14, False),
    ("CIFAR conv1 3->64 3x3 32x32", 3, 64, 3, 1, 1, 32, True),
    ("CIFAR conv2 64->64 3x3 16x16", 64, 64, 3, 1, 1, 16, False),
    ("CIFAR conv3 64->128 3x3 s2 16x16", 64, 128, 3, 2, 1, 16, False),
]


def candidates(cin, cout, k, stride, padding, size, first, batch, device, dtype):
    torch.manual_seed(0)
    ours = Conv2d(cin, cout, k, stride, padding, device=device, dtype=dtype)
    theirs = torch.nn.Conv2d(cin, cout, k, stride, padding, device=device, dtype=dtype)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(batch, cin, size, size, device=device, dtype=dtype)
    dout = torch.randn_like(ours(x))
    ours.backward(dout)
    xr = x.clone().requires_grad_(not first)

    def hand():
        ours.zero_grad()
        ours(x)
        ours.backward(dout, need_input_grad=not first)

    def torch_nn():
        theirs.zero_grad()
        theirs(xr).backward(dout)
        xr.grad = None

    def im2col():
        with kernels.disabled():
            hand()

    return {"hand": hand, "nn": torch_nn, "im2col": im2col}


def bench(fns: dict, device: torch.device, repeats: int, warmup: int) -> dict[str, float]:
    return interleaved(fns, repeats, warmup, device)


def main(argv: list[str] | None = None) -> None:
    ap = timing.parser(__doc__)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    device, dtype = args.device, getattr(torch, args.dtype)
    print(
        f"{timing.machine(device)}\nConv2d forward+backward, batch {args.batch}, {args.dtype}, median of {args.repeats}"
    )
    print(f"{'shape':<34} {'dx':>3} {'hand ms':>8} {'nn ms':>8} {'im2col ms':>9} {'vs nn':>6} {'im2col/fast':>11}")
    with torch.no_grad():
        for label, *shape, first in SHAPES:
            fns = candidates(*shape, first, args.batch, device, dtype)
            fns["nn"] = _with_grad(fns["nn"])
            t = bench(fns, device, args.repeats, args.warmup)
            print(
                f"{label:<34} {'no' if first else 'yes':>3} {t['hand'] * 1e3:8.2f} {t['nn'] * 1e3:8.2f} "
                f"{t['im2col'] * 1e3:9.2f} {t['nn'] / t['hand']:5.2f}x {t['im2col'] / t['hand']:10.2f}x"
            )


def _with_grad(f):
    """nn.Conv2d's step runs with autograd on; the hand-written ones under no_grad, as the trainer runs them."""

    def run():
        with torch.enable_grad():
            f()

    return run


if __name__ == "__main__":
    main()
