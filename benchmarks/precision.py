"""Median step time, float32 and mixed precision: hand-written (float32 master weights) vs nn.Module under autocast.

    python benchmarks/precision.py                          # default net 784-1024x3-10, batch 512, CPU
    python benchmarks/precision.py --device cuda --repeats 100 --dtypes bfloat16 float16

Candidates, interleaved round-robin in one process (one step each per round):
  handgrad float32     the hand-written Net and SGD, float32 throughout;
  handgrad <dtype>     the Net cast to <dtype> with float32 MasterWeights (+ DynamicLossScaler for float16);
  nn.Module float32    the twin, autograd, torch.optim.SGD;
  nn.Module <dtype>    the twin under torch.autocast(<dtype>) (+ torch.amp.GradScaler for float16).
Printed: median ms per step and the ratio to the float32 hand-written step (> 1 is slower).
"""

from __future__ import annotations

import sys

import timing  # a sibling script: benchmarks/ is sys.path[0] when a script here runs
import torch
import torch.nn.functional as F
from timing import interleaved

from losses import CrossEntropyLoss
from models import Net, PytorchNet
from optimizers import SGD
from training.precision.loss_scale import DynamicLossScaler
from training.precision.master import MasterWeights


def handgrad_step(net, dtype, lr):
    crit = CrossEntropyLoss()
    if dtype == torch.float32:
        opt = SGD(net.parameters(), lr=lr, momentum=0.9)

        def step(x, y):
            opt.zero_grad()
            crit(net(x), y)
            net.backward(crit.backward())
            opt.step()

        return step
    master = MasterWeights(net, cast_to=dtype)
    opt = SGD(master.parameters(), lr=lr, momentum=0.9)
    scaler = DynamicLossScaler(enabled=dtype == torch.float16, device=x_device(net))

    def step(x, y):
        master.zero_grad()
        crit(net(x.to(dtype)), y)  # forward in low precision, CE in float32
        net.backward(crit.backward(scaler.scale_loss_grad()))  # the loss gradient times the scale
        master.grads_to_master(scaler)  # float32 grads, unscaled, inf/nan checked
        scaler.step(opt)  # skipped on inf/nan
        scaler.update()
        master.master_to_model()  # the new weights, rounded into the model

    return step


def torch_step(model, dtype, lr, device):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if dtype == torch.float32:

        def step(x, y):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()

        return step
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    def step(x, y):
        opt.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    return step


def x_device(net) -> torch.device:
    return next(iter(net.parameters())).device


def main(argv=None) -> int:
    ap = timing.parser(__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16"], choices=["bfloat16", "float16"])
    args = ap.parse_args(argv)
    device = args.device
    torch.manual_seed(0)
    x = torch.randn(args.batch, 784, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    steps = {}
    for dtype in [torch.float32] + [getattr(torch, d) for d in args.dtypes]:
        torch.manual_seed(0)
        net = Net(hidden_size=args.hidden, depth=args.depth, device=device)
        twin = PytorchNet(hidden_size=args.hidden, depth=args.depth, device=device)
        twin.load_state_dict(net.state_dict())
        name = str(dtype).removeprefix("torch.")
        steps[f"handgrad {name}"] = handgrad_step(net, dtype, 0.01)
        steps[f"nn.Module {name}"] = torch_step(twin, dtype, 0.01, device)
    medians = interleaved(steps, args.repeats, args.warmup, device, (x, y))
    print(
        f"{timing.machine(device)}\nnet 784-{args.hidden}x{args.depth}-10, batch {args.batch}, median of {args.repeats}"
    )
    base = medians["handgrad float32"]
    for k, med in medians.items():
        print(f"  {k:22s} {med * 1e3:10.2f} ms   {med / base:7.2f}x handgrad float32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
