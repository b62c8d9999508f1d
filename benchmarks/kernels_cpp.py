"""Each C++ kernel (kernels/cpp/) against ATen's fused kernel for the same step and the textbook path, on the CPU.

    python benchmarks/kernels_cpp.py --threads 1                     # GPT-2 small's widths, float32
    python benchmarks/kernels_cpp.py --threads 1 --rows 64 --repeats 5 --dtype float64

One table: for each kernel the median time of the C++ kernel ("cpp"), of ATen's fused kernel ("aten": F.layer_norm
forward, native_layer_norm_backward, gelu_backward, torch.optim's fused=True step, log_softmax + nll_loss and their
backward), of the eager kernels of kernels/ that ran before the C++ ones ("eager": the same layer with
kernels.cpp.disabled(); "-" where they are the textbook) and of the layer's textbook ("textbook":
kernels.disabled()), each as a ratio t_other / t_cpp (> 1: the C++ kernel is faster).  Shapes: layer norm on (rows,
C), batch norm in training on (rows / 8, C / 24, 28, 28) (the CNN's first, at the defaults; ATen: native_batch_norm
and its backward), GELU on (rows, 4C), cross-entropy on (rows, vocab), the optimizers over GPT-2 small's block of
weights (C x 3C, C x C, C x 4C, 4C x C: 7.1M values at C = 768), one LSTM or GRU layer over the character LSTM's
sequence (T 64, batch 32, input 64, hidden 256: the layer's forward and backward, the gates one C++ pass a step,
against nn.LSTM / nn.GRU forward and backward by autograd, oneDNN's fused recurrent kernel on the CPU), max
pooling's backward at (rows / 32, C / 12, 32, 32), 2 x 2 windows (ATen: max_pool2d_with_indices_backward), causal
attention forward and backward over rows / 256 sequences of 256 tokens, C / 64 heads of 64 (ATen:
F.scaled_dot_product_attention by autograd, its flash attention kernel on the CPU).
Candidates run interleaved (benchmarks/timing.py).
Before timing, each kernel's result is compared with ATen's and the run stops where they differ beyond the dtype's
rounding: a fast wrong kernel is not a result.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import timing  # a sibling script: benchmarks/ is sys.path[0] when a script here runs
import torch
import torch.nn.functional as F
from timing import interleaved

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the project, where it is not installed

import kernels  # noqa: E402
import optimizers  # noqa: E402
from kernels import cpp  # noqa: E402
from layers import GELU, GRU, LSTM, BatchNorm2d, LayerNorm, MaxPool2d, ScaledDotProductAttention  # noqa: E402
from losses import CrossEntropyLoss  # noqa: E402

KERNELS = (
    "layernorm_fwd",
    "layernorm_bwd",
    "batchnorm_fwd",
    "batchnorm_bwd",
    "gelu_bwd",
    "gelu_tanh_bwd",
    "cross_entropy",
    "sgd",
    "adam",
    "adamw",
    "lstm",
    "gru",
    "maxpool_bwd",
    "attention",
)
SEQ, BATCH, INPUT, HIDDEN = 64, 32, 64, 256  # the recurrent rows: the character LSTM's (benchmarks/lstm_step.py)
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def layer_backward(layer, x, dout):
    """A callable running ``layer``'s backward_math on what one forward kept (the kept state reused each call),
    without autograd recording, as the layer's backward runs it."""
    _, saved = layer.forward_math(x)
    return lambda: _with(torch.no_grad(), lambda: layer.backward_math(dout, saved))


def cases(name: str, rows: int, C: int, vocab: int, dtype: torch.dtype, g: torch.Generator):
    """name -> (candidates {"cpp", "aten", "eager", "textbook"}: callables, a check () -> relative error)."""
    r = lambda *s: torch.randn(s, generator=g, dtype=dtype)  # noqa: E731
    ops = cpp.ops
    if name == "layernorm_fwd":
        x, w, b = r(rows, C), r(C), r(C)

        def textbook():
            mean = x.mean(1, keepdim=True)
            xc = x - mean
            return xc * torch.rsqrt((xc * xc).mean(1, keepdim=True) + 1e-5) * w + b

        cands = {"cpp": lambda: ops.layer_norm_forward(x, w, b, 1e-5), "aten": lambda: F.layer_norm(x, (C,), w, b)}
        cands["textbook"] = textbook
        return cands, lambda: rel(cands["cpp"]()[0], cands["aten"]())
    if name == "layernorm_bwd":
        x, dout = r(rows, C), r(rows, C)
        ln = LayerNorm(C, dtype=dtype)
        ln.weight.detach().copy_(r(C))
        _, mean, rstd = torch.native_layer_norm(x, (C,), ln.weight, ln.bias, 1e-5)
        run = layer_backward(ln, x, dout)
        cands = {
            "cpp": run,
            "aten": lambda: torch.ops.aten.native_layer_norm_backward(
                dout, x, (C,), mean, rstd, ln.weight, ln.bias, [True, True, True]
            ),
            "eager": lambda: _with(cpp.disabled(), run),
            "textbook": lambda: _with(kernels.disabled(), run),
        }
        return cands, lambda: rel(run()[0], cands["aten"]()[0])
    if name in ("batchnorm_fwd", "batchnorm_bwd"):  # training: the batch's statistics
        N, ch = max(rows // 8, 2), max(C // 24, 1)  # (at least two samples of one channel: small --rows, --C)
        x, dout = r(N, ch, 28, 28), r(N, ch, 28, 28)
        bn = BatchNorm2d(ch, dtype=dtype)
        bn.weight.detach().copy_(r(ch)), bn.bias.detach().copy_(r(ch))
        w, b = bn.weight.detach(), bn.bias.detach()
        if name == "batchnorm_fwd":
            run = lambda: _with(torch.no_grad(), lambda: bn.forward_math(x)[0])  # noqa: E731
            cands = {
                "cpp": run,
                "aten": lambda: torch.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)[0],
                "textbook": lambda: _with(kernels.disabled(), run),
            }
            return cands, lambda: rel(run(), cands["aten"]())
        # each path's backward on what its own forward kept (the C++ forward keeps x, the others x - mean)
        with torch.no_grad():  # (as the layer's own forward runs forward_math)
            runs = {k: _with(c(), lambda: layer_backward(bn, x, dout)) for k, c in PATHS.items()}
        _, mean, rstd = torch.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
        cands = {
            "cpp": runs["cpp"],
            "aten": lambda: torch.ops.aten.native_batch_norm_backward(
                dout, x, w, None, None, mean, rstd, True, 1e-5, [True, True, True]
            ),
            "eager": lambda: _with(cpp.disabled(), runs["eager"]),
            "textbook": lambda: _with(kernels.disabled(), runs["textbook"]),
        }
        return cands, lambda: rel(runs["cpp"]()[0], cands["aten"]()[0])
    if name in ("gelu_bwd", "gelu_tanh_bwd"):
        approximate = "tanh" if name == "gelu_tanh_bwd" else "none"
        x, dout = r(rows, 4 * C), r(rows, 4 * C)
        run = layer_backward(GELU(approximate=approximate), x, dout)
        cands = {
            "cpp": run,
            "aten": lambda: torch.ops.aten.gelu_backward(dout, x, approximate=approximate),
            "eager": lambda: _with(cpp.disabled(), run),
            "textbook": lambda: _with(kernels.disabled(), run),
        }
        return cands, lambda: rel(run(), cands["aten"]())
    if name == "cross_entropy":  # the loss and its gradient: forward and backward
        z, y = r(rows, vocab), torch.randint(0, vocab, (rows,), generator=g)

        def cpp_step():
            logp, total = ops.cross_entropy_forward(z, y, 0.0)
            return ops.cross_entropy_backward(logp, y, 1.0 / rows, 0.0)

        def aten_step():
            logp = torch.ops.aten._log_softmax(z, 1, False)
            loss, total_weight = torch.ops.aten.nll_loss_forward(logp, y, None, 1, -100)
            dlogp = torch.ops.aten.nll_loss_backward(torch.ones((), dtype=dtype), logp, y, None, 1, -100, total_weight)
            return torch.ops.aten._log_softmax_backward_data(dlogp, logp, 1, dtype)

        crit = CrossEntropyLoss()

        def layer_step():
            crit(z, y)
            return crit.backward()

        cands = {"cpp": cpp_step, "aten": aten_step, "textbook": lambda: _with(kernels.disabled(), layer_step)}
        cands["eager"] = lambda: _with(cpp.disabled(), layer_step)  # (the layer calls the C++ backward alone)
        return cands, lambda: rel(cpp_step(), aten_step())
    if name in ("lstm", "gru"):  # one layer's forward and backward over a sequence
        cls = LSTM if name == "lstm" else GRU
        x, dout = r(SEQ, BATCH, INPUT), r(SEQ, BATCH, HIDDEN)
        layer = cls(INPUT, HIDDEN, dtype=dtype)
        twin = layer.to_torch()

        def layer_step():
            layer(x)
            return layer.backward(dout)

        def aten_step():
            xr = x.clone().requires_grad_(True)
            out, _ = twin(xr)
            return torch.autograd.grad(out, [xr, *twin.parameters()], dout)[0]

        cands = {"cpp": layer_step, "aten": aten_step}
        cands["eager"] = lambda: _with(cpp.disabled(), layer_step)
        cands["textbook"] = lambda: _with(kernels.disabled(), layer_step)
        return cands, lambda: rel(layer_step(), aten_step())
    if name == "maxpool_bwd":
        x = r(max(rows // 32, 1), max(C // 12, 1), 32, 32)
        pool = MaxPool2d(2)
        out, idx = F.max_pool2d(x, 2, return_indices=True)
        dout = r(*out.shape)
        run = layer_backward(pool, x, dout)
        cands = {
            "cpp": run,
            "aten": lambda: torch.ops.aten.max_pool2d_with_indices_backward(
                dout, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx
            ),
            "eager": lambda: _with(cpp.disabled(), run),
            "textbook": lambda: _with(kernels.disabled(), run),
        }
        return cands, lambda: rel(run(), cands["aten"]())
    if name == "attention":  # causal, forward and backward
        T, heads = 256, max(C // 64, 1)
        q, k, v, dout = (r(max(rows // T, 1), heads, T, 64) for _ in range(4))
        att = ScaledDotProductAttention()

        def layer_step():
            att(q, k, v, is_causal=True)
            return att.backward(dout)[0]

        def aten_step():
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
            out = F.scaled_dot_product_attention(*leaves, is_causal=True)
            return torch.autograd.grad(out, leaves, dout)[0]

        cands = {"cpp": layer_step, "aten": aten_step}
        cands["eager"] = lambda: _with(cpp.disabled(), layer_step)
        cands["textbook"] = lambda: _with(kernels.disabled(), layer_step)
        return cands, lambda: rel(layer_step(), aten_step())
    # the optimizers: one step over GPT-2 small's block of weights, the same gradients every step
    shapes = ((C, 3 * C), (C, C), (C, 4 * C), (4 * C, C))
    start = [r(*s) for s in shapes]
    grads = [r(*s) * 1e-2 for s in shapes]
    opt_name, kw = {
        "sgd": ("SGD", {"lr": 1e-2, "momentum": 0.9, "weight_decay": 1e-4}),
        "adam": ("Adam", {"lr": 1e-3, "weight_decay": 1e-4}),
        "adamw": ("AdamW", {"lr": 1e-3, "weight_decay": 1e-1}),
    }[name]

    def make(kind):
        params = [p.clone().requires_grad_(True) for p in start]
        for p, gr in zip(params, grads, strict=True):
            p.grad = gr
        if kind == "aten":
            return params, getattr(torch.optim, opt_name)(params, fused=True, **kw)
        return params, getattr(optimizers, opt_name)(params, **kw)

    made = {kind: make(kind) for kind in ("cpp", "aten", "textbook")}
    for kind, (_, opt) in made.items():  # the first step (SGD's buffer, Adam's state) before any timing
        _with(kernels.disabled() if kind == "textbook" else torch.no_grad(), opt.step)

    def check():
        made["cpp"][1].step()
        made["aten"][1].step()
        return max(rel(a.detach(), b.detach()) for a, b in zip(made["cpp"][0], made["aten"][0], strict=True))

    cands = {
        "cpp": made["cpp"][1].step,
        "aten": made["aten"][1].step,
        "textbook": lambda: _with(kernels.disabled(), made["textbook"][1].step),
    }
    return cands, check


PATHS = {"cpp": contextlib.nullcontext, "eager": cpp.disabled, "textbook": kernels.disabled}  # their switches


def _with(context, fn):
    with context:
        return fn()


def main(argv=None) -> int:
    p = timing.parser(__doc__, device=False, clock=True)
    p.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated, of {','.join(KERNELS)}")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--rows", type=int, default=1024, help="rows: batch x sequence (default 1024)")
    p.add_argument("--C", type=int, default=768, help="the model's width (default 768, GPT-2 small's)")
    p.add_argument("--vocab", type=int, default=8192, help="classes of the cross-entropy (default 8192)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    names = [k.strip() for k in args.kernels.split(",") if k.strip()]
    unknown = [k for k in names if k not in KERNELS]
    if unknown:
        p.error(f"--kernels: unknown {', '.join(unknown)} (choose from {', '.join(KERNELS)})")
    if not cpp.available():  # said in one warning by kernels/cpp
        print("the C++ kernels are not available here: nothing to measure")
        return 1
    dtype = getattr(torch, args.dtype)
    device = torch.device("cpu")
    print(timing.machine(device, args.clock))
    print(f"{args.dtype}; rows {args.rows}, C {args.C}, vocab {args.vocab}; median of {args.repeats} rounds")
    head = f"{'kernel':<15}{'cpp ms':>10}{'aten ms':>10}{'eager ms':>10}{'textbook ms':>13}"
    head += f"{'aten/cpp':>10}{'eager/cpp':>11}{'textbook/cpp':>14}"
    print(head)
    g = torch.Generator().manual_seed(0)
    for name in names:
        cands, check = cases(name, args.rows, args.C, args.vocab, dtype, g)
        err = check()
        if not err <= TOLERANCE[dtype]:
            print(f"{name}: the C++ kernel differs from ATen's by {err:.2e} (relative): not timed")
            return 1
        t = interleaved(cands, args.repeats, args.warmup, device, clock=args.clock)
        ms = {k: f"{v * 1e3:.3f}" for k, v in t.items()}
        ratio = {k: f"{v / t['cpp']:.2f}x" for k, v in t.items()}
        row = f"{name:<15}{ms['cpp']:>10}{ms['aten']:>10}{ms.get('eager', '-'):>10}{ms['textbook']:>13}"
        row += f"{ratio['aten']:>10}{ratio.get('eager', '-'):>11}{ratio['textbook']:>14}"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
