"""Median time of one training step: handgrad (the README's call, captured) vs nn.Module (eager, torch.compile)
vs the GEMM-only bound.

    python benchmarks/step.py                          # small, default nets and the CNN on the CPU
    python benchmarks/step.py --nets small,default,large,cnn --device cuda --repeats 200
    python benchmarks/step.py --compile                # adds handgrad's step compiled whole, and nn.Module under
                                                       # torch.compile in each mode (the model; the model and
                                                       # torch.compile(opt.step))
    python benchmarks/step.py --half bfloat16          # adds mixed-precision rows: master weights vs autocast
    python benchmarks/step.py --threads 1 --clock cpu  # CPU time of one thread: steadier on a shared machine

A step is zero_grad, forward, cross-entropy, backward and optimizer step (SGD with momentum 0.9, and
Adam).  The candidates run interleaved in one process (round-robin, one step each per round), so drift
in machine speed hits all of them alike.  Ratios: "vs nn.Module" = t_nn / t for the nn.Module eager
step with the same optimizer (> 1 is faster); "x GEMM" = t / t_gemm, where the bound runs the step's
matrix products alone into preallocated outputs.

handgrad rows:
  README call        opt.zero_grad(); crit(net(x), y); net.backward(crit.backward()); opt.step()
                     (a container skips its first layer's input gradient unless asked for it)
  need_input_grad    the same with net.backward(dout, need_input_grad=True): the first layer's dx too
  captured           zero_grad(set_to_none=False), optimizer capturable=True, the step wrapped in
                     training.cuda_graph.CapturedStep: one CUDA graph replay per step on a GPU, a plain
                     call on the CPU (where it measures the in-place, device-counter path)
  compiled           --compile: the README call under torch.compile(step, fullgraph=True), one graph for
                     zero_grad, forward, loss, backward and the optimizer step
  compiled fast      --compile: that step with torch.compile's guard evaluation skipped where proven safe
                     (training/compiled_fast.py's GuardFreeStep)
  <half> master      --half: the Net in bfloat16/float16 with float32 MasterWeights (benchmarks/precision.py),
                     compared with the twin under torch.autocast (+ GradScaler for float16)
The cnn "net" is train.py --model cnn (batch 128, Adam) vs its twin, and Conv2d's textbook (the kernels off)
vs its kernels (benchmarks/cnn_step.py's rows).
"""

from __future__ import annotations

import sys

import cnn_step  # sibling scripts: benchmarks/ is sys.path[0] when a script here runs
import precision
import timing
import torch
import torch.nn.functional as F
from timing import interleaved

import optimizers
from autodiff import EngineNet, cross_entropy
from losses import CrossEntropyLoss
from models import Net, PytorchNet
from training.cuda_graph import CapturedStep

NETS = {  # name: (label, hidden, batch, CPU repeats by default)
    "small": ("small net 784-128x3-10, batch 64", 128, 64, 1000),
    "default": ("default net 784-1024x3-10, batch 512", 1024, 512, 30),
    "large": ("large net 784-4096x3-10, batch 4096", 4096, 4096, 3),
    "cnn": ("train.py --model cnn, batch 128, Adam", None, 128, 30),
}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


def handgrad_step(net, opt, crit, need_input_grad=False, set_to_none=True):
    def step(x, y):
        opt.zero_grad(set_to_none=set_to_none)
        loss = crit(net(x), y)
        if need_input_grad:
            net.backward(crit.backward(), need_input_grad=True)
        else:
            net.backward(crit.backward())  # the README's call
        opt.step()
        return loss

    return step


def engine_step(model, opt):
    def step(x, y):
        opt.zero_grad()
        cross_entropy(model(x), y).backward()
        opt.step()

    return step


def torch_step(model, opt, mark_step=False, opt_step=None):
    """nn.Module's step; ``opt_step``: the optimizer's step compiled (torch.compile(opt.step)), else opt.step."""
    opt_step = opt.step if opt_step is None else opt_step

    def step(x, y):
        if mark_step:  # torch.compile's CUDA graphs: a new step begins, earlier outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt_step()

    return step


def gemm_bound(net, x):
    """The step's matrix products alone, into preallocated outputs: forward x@W^T, backward dout^T@x and dout@W."""
    weights = [p.detach() for name, p in net.named_parameters() if name.endswith("weight")]  # (H, D) each
    acts = [x]
    for w in weights:
        acts.append(torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype))
    dws = [torch.empty_like(w) for w in weights]

    def step(_x, _y):
        for i, w in enumerate(weights):
            torch.mm(acts[i], w.t(), out=acts[i + 1])  # forward (N, H)
        for i in reversed(range(len(weights))):
            torch.mm(acts[i + 1].t(), acts[i], out=dws[i])  # dW (H, D), dout stands in for the activation
            if i > 0:
                torch.mm(acts[i + 1], weights[i], out=acts[i])  # dx (N, D), not needed for the input

    return step


def _guard_free(net, opt):
    """The compiled step with guard evaluation skipped where proven safe (training/compiled_fast.py)."""
    from training.compiled_fast import GuardFreeStep

    return GuardFreeStep(torch.compile(handgrad_step(net, opt, CrossEntropyLoss()), fullgraph=True), net, opt)


def candidates(hidden, x, y, device, compile_modes, halves=()):
    """name -> (step function, the name of the nn.Module row it is compared with)."""
    torch.manual_seed(0)
    ref = Net(hidden_size=hidden, device=device)
    sd = ref.state_dict()

    def hand():
        net = Net(hidden_size=hidden, device=device)
        net.load_state_dict(sd)
        return net

    def twin():
        m = PytorchNet(hidden_size=hidden, device=device)
        m.load_state_dict(sd)
        return m

    def sgd(params, **kw):
        return optimizers.SGD(params, lr=1e-3, momentum=0.9, **kw)

    nn_sgd, nn_adam = "nn.Module eager, SGD", "nn.Module eager, Adam"
    c = {}
    if compile_modes:  # each compiled row is a new closure of handgrad_step's one function: a cache entry each
        import torch._dynamo as dynamo

        dynamo.config.recompile_limit = max(dynamo.config.recompile_limit, 64)
    net = hand()
    c["handgrad README call, SGD"] = (handgrad_step(net, sgd(net.parameters()), CrossEntropyLoss()), nn_sgd)
    net = hand()
    c["handgrad need_input_grad, SGD"] = (handgrad_step(net, sgd(net.parameters()), CrossEntropyLoss(), True), nn_sgd)
    net = hand()
    captured = CapturedStep(
        handgrad_step(net, sgd(net.parameters(), capturable=True), CrossEntropyLoss(), set_to_none=False), x, y
    )
    c["handgrad captured, SGD"] = (captured, nn_sgd)
    m = twin()
    c[nn_sgd] = (torch_step(m, torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)), nn_sgd)
    if compile_modes:
        net = hand()
        c["handgrad compiled (fullgraph), SGD"] = (
            torch.compile(handgrad_step(net, sgd(net.parameters()), CrossEntropyLoss()), fullgraph=True),
            nn_sgd,
        )
        net = hand()
        c["handgrad compiled fast, SGD"] = (_guard_free(net, sgd(net.parameters())), nn_sgd)
    for mode in compile_modes:
        m = twin()
        cm = torch.compile(m, mode=mode)
        c[f"nn.Module compile {mode}, SGD"] = (
            torch_step(cm, torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9), mark_step=mode == "reduce-overhead"),
            nn_sgd,
        )
        m = twin()
        cm, opt = torch.compile(m, mode=mode), torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
        c[f"nn.Module + opt.step compile {mode}, SGD"] = (
            torch_step(cm, opt, mark_step=mode == "reduce-overhead", opt_step=torch.compile(opt.step, mode=mode)),
            nn_sgd,
        )
    net = hand()
    c["handgrad README call, Adam"] = (
        handgrad_step(net, optimizers.Adam(net.parameters(), lr=1e-4), CrossEntropyLoss()),
        nn_adam,
    )
    net = hand()
    captured = CapturedStep(
        handgrad_step(
            net, optimizers.Adam(net.parameters(), lr=1e-4, capturable=True), CrossEntropyLoss(), set_to_none=False
        ),
        x,
        y,
    )
    c["handgrad captured, Adam"] = (captured, nn_adam)
    if compile_modes:
        net = hand()
        c["handgrad compiled (fullgraph), Adam"] = (
            torch.compile(
                handgrad_step(net, optimizers.Adam(net.parameters(), lr=1e-4), CrossEntropyLoss()), fullgraph=True
            ),
            nn_adam,
        )
        net = hand()
        c["handgrad compiled fast, Adam"] = (_guard_free(net, optimizers.Adam(net.parameters(), lr=1e-4)), nn_adam)
    m = twin()
    c[nn_adam] = (torch_step(m, torch.optim.Adam(m.parameters(), lr=1e-4, capturable=device.type == "cuda")), nn_adam)
    engine = EngineNet(hidden_size=hidden, device=device)
    engine.load_state_dict(sd)
    c["autodiff engine, Adam"] = (engine_step(engine, optimizers.Adam(engine.parameters(), lr=1e-4)), nn_adam)
    for half in halves:
        dtype = getattr(torch, half)
        nn_half = f"nn.Module autocast {half}, SGD"
        c[f"handgrad {half} master weights, SGD"] = (precision.handgrad_step(hand(), dtype, 1e-3), nn_half)
        c[nn_half] = (precision.torch_step(twin(), dtype, 1e-3, device), nn_half)
    c["GEMM-only bound"] = (gemm_bound(ref, x), None)
    return c


def bench(hidden, batch, device, repeats, warmup, compile_modes, halves=(), clock="wall"):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 784, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    cands = candidates(hidden, x, y, device, compile_modes, halves)
    medians = interleaved(
        {name: step for name, (step, _) in cands.items()}, repeats, warmup, device, (x, y), clock=clock
    )
    return {name: (t, cands[name][1]) for name, t in medians.items()}


def main(argv=None) -> int:
    ap = timing.parser(__doc__, clock=True)
    ap.add_argument(
        "--nets",
        default=None,
        help=f"comma-separated, of {', '.join(NETS)} (default: small,default,cnn on the CPU, all on CUDA)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed rounds (default per net on the CPU: small 1000, default 30, large 3, cnn 30; CUDA 300)",
    )
    ap.add_argument("--warmup", type=int, default=5, help="untimed rounds first (>= 4: the captured rows capture)")
    ap.add_argument(
        "--compile",
        nargs="?",
        const=",".join(COMPILE_MODES),
        default="",
        help=f"add nn.Module under torch.compile, in these comma-separated modes "
        f"(default with the flag: {','.join(COMPILE_MODES)})",
    )
    ap.add_argument(
        "--half",
        nargs="+",
        default=[],
        choices=["bfloat16", "float16"],
        help="add mixed-precision rows for the MLPs in these dtypes",
    )
    args = ap.parse_args(argv)
    device = args.device
    names = (args.nets or ("small,default,large,cnn" if device.type == "cuda" else "small,default,cnn")).split(",")
    unknown = [n for n in names if n not in NETS]
    if unknown:
        ap.error(f"--nets: unknown {unknown}; known: {', '.join(NETS)}")
    modes = [m for m in args.compile.split(",") if m]
    bad = [m for m in modes if m not in COMPILE_MODES]
    if bad:
        ap.error(f"--compile: unknown mode(s) {bad}; known: {', '.join(COMPILE_MODES)}")
    print(timing.machine(device, args.clock))
    print(
        "float32; one training step per round (zero_grad, forward, loss, backward, optimizer step), the candidates "
        "interleaved"
    )
    for key in names:
        label, hidden, batch, cpu_reps = NETS[key]
        reps = args.repeats or (cpu_reps if device.type == "cpu" else 300)
        if key == "cnn":
            print_cnn(
                label, cnn_step.cnn_rows(device, batch, reps, args.warmup, clock=args.clock, compile=bool(modes)), reps
            )
            continue
        rows = bench(hidden, batch, device, reps, args.warmup, modes, args.half, clock=args.clock)
        gemm = rows["GEMM-only bound"][0]
        print(f"\n{label}: median of {reps} interleaved steps")
        print(f"  {'candidate':<46}{'ms/step':>10}{'vs nn.Module':>14}{'x GEMM':>9}")
        for name, (t, ref) in rows.items():
            vs = f"{rows[ref][0] / t:.2f}x" if ref is not None else ""
            print(f"  {name:<46}{t * 1e3:>10.3f}{vs:>14}{t / gemm:>8.2f}x")
    return 0


def print_cnn(label: str, rows: dict[str, float], reps: int) -> None:
    refs = {
        "handgrad CNN + handgrad Adam": "nn.Module CNN + torch.optim.Adam",
        "nn.Module CNN + torch.optim.Adam": "nn.Module CNN + torch.optim.Adam",
        "handgrad CNN + Adam, compiled (fullgraph)": "nn.Module CNN + torch.optim.Adam",
        "nn.Module CNN compiled + torch.optim.Adam": "nn.Module CNN + torch.optim.Adam",
        "Conv2d 32->64 3x3, textbook": "Conv2d 32->64 3x3, kernels",
    }
    print(f"\n{label}: median of {reps} interleaved steps (the textbook row: vs the kernels)")
    print(f"  {'candidate':<46}{'ms/step':>10}{'vs nn.Module':>14}")
    for name, t in rows.items():
        vs = f"{rows[refs[name]] / t:.2f}x" if name in refs else ""
        print(f"  {name:<46}{t * 1e3:>10.3f}{vs:>14}")


if __name__ == "__main__":
    sys.exit(main())
