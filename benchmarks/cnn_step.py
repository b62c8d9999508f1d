"""One training step of the hand-written CNN (train.py --model cnn) vs its nn.Module twin, and Conv2d's textbook
backward (its im2col form, the kernels off) vs its kernels, interleaved in one process.

    python benchmarks/cnn_step.py [--device cuda] [--batch-size 128] [--repeats 30] [--threads 1 --clock cpu]

A step is forward, cross-entropy, backward and an Adam step, in training mode (batch statistics, dropout).
"speed vs nn.Module" = t_nn / t (> 1 is faster).  The textbook row times layers.Conv2d's forward and backward with
the kernels off (``kernels.disabled()``: the backward's im2col form, unfold, products, fold) against the same with
the kernels on, on the CNN's second convolution's shapes.
"""

from __future__ import annotations

import sys

import timing  # a sibling script: benchmarks/ is sys.path[0] when a script here runs
import torch
import torch.nn.functional as F
from timing import interleaved

import kernels
import optimizers
from layers import Conv2d
from losses import CrossEntropyLoss
from training.impls.models import cnn


def compiled_cnn_step(device: torch.device, x, y):
    """The hand-written CNN's step under torch.compile(fullgraph=True), on a model of its own."""
    torch.manual_seed(0)
    ours = cnn(device=device)
    opt, crit = optimizers.Adam(ours.parameters(), lr=1e-4), CrossEntropyLoss()

    def step():
        opt.zero_grad()
        crit(ours(x), y)
        ours.backward(crit.backward())
        opt.step()

    return torch.compile(step, fullgraph=True)


def cnn_rows(
    device: torch.device, batch: int, repeats: int, warmup: int = 3, clock: str = "wall", compile: bool = False
) -> dict[str, float]:
    torch.manual_seed(0)
    ours = cnn(device=device)
    twin = ours.to_torch()
    opt_m, opt_t = optimizers.Adam(ours.parameters(), lr=1e-4), torch.optim.Adam(twin.parameters(), lr=1e-4)
    crit = CrossEntropyLoss()
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def manual():
        opt_m.zero_grad()
        crit(ours(x), y)
        ours.backward(crit.backward())
        opt_m.step()

    def torch_step():
        opt_t.zero_grad()
        F.cross_entropy(twin(x), y).backward()
        opt_t.step()

    conv = Conv2d(32, 64, 3, padding=1, device=device)
    xc = torch.randn(batch, 32, 14, 14, device=device)
    dc = torch.randn(batch, 64, 14, 14, device=device)

    def fast_conv():
        conv(xc)
        conv.backward(dc)
        conv.weight.grad = conv.bias.grad = None

    def textbook_conv():
        with kernels.disabled():
            fast_conv()

    cands = {
        "handgrad CNN + handgrad Adam": manual,
        "nn.Module CNN + torch.optim.Adam": torch_step,
        "Conv2d 32->64 3x3, kernels": fast_conv,
        "Conv2d 32->64 3x3, textbook": textbook_conv,
    }
    if compile:
        cands["handgrad CNN + Adam, compiled (fullgraph)"] = compiled_cnn_step(device, x, y)
        twin_c = ours.to_torch()
        opt_c, model_c = torch.optim.Adam(twin_c.parameters(), lr=1e-4), torch.compile(twin_c)

        def torch_compiled():
            opt_c.zero_grad()
            F.cross_entropy(model_c(x), y).backward()
            opt_c.step()

        cands["nn.Module CNN compiled + torch.optim.Adam"] = torch_compiled
    return interleaved(cands, repeats, warmup, device, clock=clock)


def main(argv=None) -> int:
    ap = timing.parser(__doc__, clock=True)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument(
        "--compile",
        action="store_true",
        help="add the hand-written step under torch.compile (fullgraph) and the twin with its model compiled",
    )
    a = ap.parse_args(argv)
    device = a.device
    rows = cnn_rows(device, a.batch_size, a.repeats, clock=a.clock, compile=a.compile)
    print(f"{timing.machine(device, a.clock)}")
    print(
        f"float32, batch {a.batch_size}, one training step (zero_grad, forward, loss, backward, Adam step), median "
        f"of {a.repeats} interleaved rounds; ratio = t_reference / t (> 1: faster)"
    )
    ref = {
        "handgrad CNN + handgrad Adam": "nn.Module CNN + torch.optim.Adam",
        "handgrad CNN + Adam, compiled (fullgraph)": "nn.Module CNN + torch.optim.Adam",
        "nn.Module CNN compiled + torch.optim.Adam": "nn.Module CNN + torch.optim.Adam",
        "Conv2d 32->64 3x3, textbook": "Conv2d 32->64 3x3, kernels",
    }
    print(f"  {'candidate':<38}{'ms':>9}{'ratio':>28}")
    for name, t in rows.items():
        ratio = f"{rows[ref[name]] / t:.2f}x vs {'nn.Module' if 'CNN' in name else 'kernels'}" if name in ref else ""
        print(f"  {name:<38}{t * 1e3:>9.2f}{ratio:>28}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
