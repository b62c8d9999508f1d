"""Each hand-written Triton kernel (kernels/triton/) against the PyTorch kernel it replaces, on a CUDA device.

    python benchmarks/kernels_triton.py                                # GPT-2 small's shapes, bfloat16 and float32
    python benchmarks/kernels_triton.py --kernels attention,adamw --dtypes bfloat16 --repeats 50

Shapes are GPT-2 small's at batch 8 (``--batch``, ``--T``, ``--C``, ``--heads``, ``--vocab``; ``--params`` for
AdamW): layer norm on (B*T, C), GELU on (B*T, 4C), causal attention on (B, heads, T, C/heads), softmax
cross-entropy on (B*T, vocab), AdamW over a flat buffer of 124M parameters.  Each kernel is timed forward
("fwd") and forward plus backward ("fwd+bwd"; AdamW: one step) against torch's: F.layer_norm, F.gelu,
F.scaled_dot_product_attention (its flash kernel where torch picks it), F.cross_entropy, their autograd
backward (native_layer_norm_backward, gelu_backward, the flash attention backward, the log-softmax backward),
and torch.optim.AdamW(fused=True).  Time: the median over interleaved rounds (benchmarks/timing.py), each
round ``--inner`` calls between two synchronisations, divided by --inner; "vs torch" = t_torch / t_triton (> 1:
the Triton kernel is faster); tokens/s = B*T / t.  Before timing, each kernel's result is compared with torch's
and the run stops if they differ beyond the dtype's rounding (a fast wrong kernel is not a result).

Triton compiles for GPUs only: on a machine without CUDA the script refuses in one line (`pytest -m triton`
checks the kernels there, in Triton's interpreter, which says nothing of speed).  The first call of each kernel
compiles it (seconds); the warm-up rounds absorb that.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import timing  # a sibling script: benchmarks/ is sys.path[0] when a script here runs
import torch
import torch.nn.functional as F
from timing import interleaved

sys.path.append(str(Path(__file__).resolve().parents[1]))  # kernels/, where the project is not installed

KERNELS = ("layernorm", "gelu", "attention", "cross_entropy", "adamw")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3, torch.float32: 1e-4}  # max|a - b| / max|b| vs torch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def layernorm(tk, a, dtype, dev):
    x = torch.randn(a.batch * a.T, a.C, dtype=dtype, device=dev)
    w, b = torch.randn(a.C, dtype=dtype, device=dev), torch.randn(a.C, dtype=dtype, device=dev)
    dout = torch.randn_like(x)
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))

    def ours_fwd():
        return tk.layer_norm_forward(x, w, b)

    def ours_step():
        out, mean, rstd = tk.layer_norm_forward(x, w, b)
        return out, *tk.layer_norm_backward(dout, x, w, b, mean, rstd)

    def torch_fwd():
        return F.layer_norm(x, (a.C,), w, b)

    def torch_step():
        out = F.layer_norm(xr, (a.C,), wr, br)
        return out, *torch.autograd.grad(out, (xr, wr, br), dout)

    return ours_fwd, ours_step, torch_fwd, torch_step


def gelu(tk, a, dtype, dev):
    x = torch.randn(a.batch * a.T, 4 * a.C, dtype=dtype, device=dev)
    dout = torch.randn_like(x)
    xr = x.clone().requires_grad_()

    def ours_step():
        return tk.gelu_forward(x), tk.gelu_backward(dout, x)

    def torch_step():
        out = F.gelu(xr)
        return out, *torch.autograd.grad(out, xr, dout)

    return (lambda: tk.gelu_forward(x)), ours_step, (lambda: F.gelu(x)), torch_step


def attention(tk, a, dtype, dev):
    shape = (a.batch, a.heads, a.T, a.C // a.heads)
    q, k, v, dout = (torch.randn(shape, dtype=dtype, device=dev) for _ in range(4))
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))

    def ours_step():
        out, lse = tk.flash_attention_forward(q, k, v, causal=True)
        return out, *tk.flash_attention_backward(dout, q, k, v, out, lse, causal=True)

    def torch_step():
        out = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
        return out, *torch.autograd.grad(out, (qr, kr, vr), dout)

    return (
        (lambda: tk.flash_attention_forward(q, k, v, causal=True)),
        ours_step,
        (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        torch_step,
    )


def cross_entropy(tk, a, dtype, dev):
    z = torch.randn(a.batch * a.T, a.vocab, dtype=dtype, device=dev)
    y = torch.randint(0, a.vocab, (a.batch * a.T,), device=dev)
    zr = z.clone().requires_grad_()

    def ours_step():  # llm.c's fused classifier: the loss and dlogits from one kernel
        loss, _, dz = tk.cross_entropy_forward_backward(z, y, check_targets=False)
        return loss, dz

    def torch_step():
        loss = F.cross_entropy(zr.float() if dtype != torch.float32 else zr, y)
        return loss, *torch.autograd.grad(loss, zr)

    return (
        (lambda: tk.cross_entropy_forward(z, y, check_targets=False)),
        ours_step,
        (lambda: F.cross_entropy(z.float() if dtype != torch.float32 else z, y)),
        torch_step,
    )


def adamw(tk, a, dtype, dev):
    if dtype != torch.float32:
        return None  # the update keeps float32 parameters and moments (mixed precision's master weights)
    p, g = torch.randn(a.params, device=dev), torch.randn(a.params, device=dev)
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    pr = p.clone().requires_grad_()
    pr.grad = g.clone()
    opt = torch.optim.AdamW([pr], lr=1e-4, weight_decay=0.1, fused=True)
    step = [0]

    def ours_step():
        step[0] += 1
        tk.adamw_step(p, g, m, v, step=step[0], lr=1e-4, weight_decay=0.1)
        return p

    def torch_step():
        opt.step()
        return pr.detach()

    return None, ours_step, None, torch_step


def main(argv=None) -> int:
    p = timing.parser(__doc__, device=False)
    p.set_defaults(threads=torch.get_num_threads())  # the GPU does the work: torch's own thread count, unprinted
    p.add_argument("--device", default="cuda", help="a CUDA device (default: cuda)")
    p.add_argument("--kernels", default=",".join(KERNELS), help=f"a comma-separated subset of {','.join(KERNELS)}")
    p.add_argument("--dtypes", default="bfloat16,float32", help=f"a comma-separated subset of {','.join(DTYPES)}")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--C", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--params", type=int, default=124_439_808, help="AdamW's flat buffer (GPT-2 small's count)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--inner", type=int, default=10, help="calls a timed round (their time divided by it)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error(
            f"the Triton kernels compile for a CUDA device and torch {torch.__version__} sees none here "
            f"(on a CPU, pytest -m triton checks them in Triton's interpreter, which measures no speed)"
        )
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        p.error("TRITON_INTERPRET is set: the kernels would run in Triton's interpreter; unset it to time them")
    try:
        dev = torch.device(a.device)
    except RuntimeError as e:
        p.error(f"--device {a.device!r} is not a device ({e})")
    if dev.type != "cuda":
        p.error(f"--device {a.device}: the Triton kernels run on a CUDA device")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        p.error(f"--device {a.device}: there are only {torch.cuda.device_count()} CUDA devices here")
    kernels = [k for k in a.kernels.split(",") if k]
    dtypes = [d for d in a.dtypes.split(",") if d]
    for k in kernels:
        if k not in KERNELS:
            p.error(f"--kernels: unknown kernel {k!r} (one of {','.join(KERNELS)})")
    for d in dtypes:
        if d not in DTYPES:
            p.error(f"--dtypes: unknown dtype {d!r} (one of {','.join(DTYPES)})")
    if a.C % a.heads:
        p.error(f"--C {a.C} is not a multiple of --heads {a.heads}")
    from kernels import triton as tk

    if not tk.available():
        p.error("Triton is not installed (pip install triton; torch's CUDA wheels bring it)")

    print(timing.machine(dev))
    failed = table(a, dev, tk, kernels, dtypes)
    for line in failed:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if failed else 0


def table(a, dev: torch.device, tk, kernels: list[str], dtypes: list[str]) -> list[str]:
    """Print the table's rows (a: the parsed arguments); -> the kernels that differed from torch, in words.
    (Also called on a CPU, in Triton's interpreter at toy sizes, by tests/test_triton_import.py.)"""
    print(
        f"B={a.batch} T={a.T} C={a.C} heads={a.heads} vocab={a.vocab} params={a.params}; median of {a.repeats} "
        f"rounds of {a.inner} calls after {a.warmup} warm-up rounds"
    )
    print(
        f"{'kernel':<14} {'dtype':<9} {'pass':<8} {'triton ms':>10} {'torch ms':>10} {'vs torch':>9} "
        f"{'triton tok/s':>13} {'max rel err':>12}"
    )
    tokens, failed = a.batch * a.T, []
    for name in kernels:
        for dname in dtypes:
            dtype = DTYPES[dname]
            torch.manual_seed(0)
            made = globals()[name](tk, a, dtype, dev)
            if made is None:
                print(f"{name:<14} {dname:<9} (float32 only: master weights)")
                continue
            ours_fwd, ours_step, torch_fwd, torch_step = made
            for part, ours, theirs in (("fwd", ours_fwd, torch_fwd), ("fwd+bwd", ours_step, torch_step)):
                if ours is None:
                    continue
                got, want = ours(), theirs()  # AdamW: one step each from the same start
                got = got if isinstance(got, tuple) else (got,)
                want = want if isinstance(want, tuple) else (want,)
                # ours may return more than torch (the saved statistics): torch's outputs are compared
                err = max(rel(x, y) for x, y in zip(got, want, strict=False))
                if not err <= TOLERANCE[dtype]:
                    failed.append(f"{name} {dname} {part}: max relative error {err:.2e} > {TOLERANCE[dtype]:.0e}")
                    print(f"{name:<14} {dname:<9} {part:<8} differs from torch: {err:.2e}")
                    continue
                t = interleaved(
                    {"triton": _repeat(ours, a.inner), "torch": _repeat(theirs, a.inner)}, a.repeats, a.warmup, dev
                )
                ms = {k: 1e3 * v / a.inner for k, v in t.items()}
                tok = f"{tokens / (ms['triton'] / 1e3):13.3g}" if name != "adamw" else f"{'':>13}"
                print(
                    f"{name:<14} {dname:<9} {part:<8} {ms['triton']:10.3f} {ms['torch']:10.3f} "
                    f"{ms['torch'] / ms['triton']:8.2f}x {tok} {err:12.1e}",
                    flush=True,
                )
            del made
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return failed


def _repeat(fn, n: int):
    def run():
        for _ in range(n):
            fn()

    return run


if __name__ == "__main__":
    sys.exit(main())
