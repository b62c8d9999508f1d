"""An MLP learns XOR on handgrad's autodiff engine (micrograd's classic demo, on tensors).

    python examples/xor.py
    python examples/xor.py --draw xor.svg     # also draw the last step's graph (.svg/.png/.pdf need Graphviz; .dot not)

Exit status 0 only when the loss fell below 0.01.
"""

import argparse
import shutil
import sys
from pathlib import Path

import torch

from autodiff import MLP, Tensor, draw_graph
from autodiff.draw import FORMATS, INSTALL_HINT
from optimizers import Adam

STEPS = 1000


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="An MLP learns XOR on handgrad's autodiff engine.")
    ap.add_argument(
        "--draw",
        metavar="PATH",
        type=Path,
        help=f"write the computation graph of the last step (with its gradients) to PATH; the format "
        f"is PATH's suffix: {', '.join('.' + f for f in FORMATS)}",
    )
    args = ap.parse_args(argv)
    fmt = None
    if args.draw is not None:
        fmt = args.draw.suffix.lstrip(".").lower()
        if fmt not in FORMATS:
            ap.error(f"--draw: PATH must end in one of {', '.join('.' + f for f in FORMATS)}, got {str(args.draw)!r}")
        if fmt != "dot" and shutil.which("dot") is None:
            # before training, not after it; the fix on the command line is a .dot PATH
            ap.error("--draw: " + INSTALL_HINT.format(fmt=fmt, dot=f"use --draw {args.draw.with_suffix('.dot')}"))

    torch.manual_seed(1)
    model = MLP([2, 8, 1], dtype=torch.float64)  # Linear(2, 8), tanh, Linear(8, 1)
    xs = [[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]
    ys = [0.0, 1.0, 1.0, 0.0]
    opt = Adam(model.parameters(), lr=0.05)

    for step in range(1, STEPS + 1):
        opt.zero_grad()
        preds = [model(Tensor(torch.tensor([x], dtype=torch.float64))) for x in xs]  # one (1, 1) Tensor per sample
        loss = (
            sum(((p - y) ** 2).sum() for p, y in zip(preds, ys, strict=True)) * 0.25
        )  # mean squared error, scalar Tensors
        last = loss.item() < 0.01 or step == STEPS
        loss.backward(retain_graph=last and fmt is not None)  # the drawing shows this backward's gradients
        if last and fmt is not None:
            draw_graph(loss, args.draw, fmt, labels=model.named_parameters())
            print(f"graph of step {step} written to {args.draw}")
        opt.step()
        if step % 50 == 0 or loss.item() < 0.01:
            print(f"step {step:4d}  loss {loss.item():.5f}")
        if loss.item() < 0.01:
            break

    for x, y, p in zip(xs, ys, preds, strict=True):
        print(f"{x} -> {p.item():+.3f}  (target {y})")
    return 0 if loss.item() < 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
