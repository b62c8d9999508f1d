"""One training step of a character LSTM by hand vs nn.LSTM (torch's fused recurrent kernel) with autograd, and where
the hand-written step's time goes.

    python benchmarks/lstm_step.py                           # T 64, batch 32, input 64, hidden 256, 2 layers, vocab 65
    python benchmarks/lstm_step.py --seq 128 --batch 64 --threads 2 --repeats 30
    python benchmarks/lstm_step.py --device cuda --hidden 1024 --batch 64   # the two steps only, vs cuDNN

The model is the character language model's middle and top: x (T, N, E) -> LSTM(E, H, 2 layers) -> Linear(H, V) ->
cross-entropy over all T*N positions, with the input's gradient computed (an embedding below it needs it; x stands
in for the embedding's output).  A step is zero_grad, forward, loss, backward and an AdamW step:

    handgrad   layers.LSTM, layers.Linear, losses.CrossEntropyLoss, optimizers.AdamW (float32)
    nn.LSTM    nn.LSTM, nn.Linear, F.cross_entropy, autograd, torch.optim.AdamW; on the CPU nn.LSTM runs oneDNN's
               fused LSTM kernel (one call per layer, forward and backward)

All candidates run interleaved, round-robin, one call each per round, so drift in the machine's speed hits all of
them alike; each figure is the median over the timed rounds.  "vs nn.LSTM" = t(nn.LSTM step) / t(candidate) from
this one run (> 1 is faster).  The breakdown rows time parts of the hand-written step separately on the same
shapes: the forward and the backward of the LSTM alone, the head (Linear + loss, forward and backward), the AdamW
step, and the matrix products alone -- the same calls the LSTM makes (kernels/recurrent/matmul.py), into nothing
else -- so "the rest" of the forward and of the backward is the gate arithmetic, the factor precomputation and Python.
The "products through ..." row is the hand-written step with its products the other way than
kernels/recurrent/matmul.py chooses for this CPU (oneDNN's matmul on an AMD CPU, MKL's sgemm through torch.addmm
elsewhere).
"""

from __future__ import annotations

import os
import sys

import timing  # a sibling script: benchmarks/ is sys.path[0] when a script here runs
import torch
import torch.nn.functional as F
from timing import interleaved

import optimizers
from kernels.recurrent import matmul
from layers import LSTM, Linear
from layers.template import Product
from losses import CrossEntropyLoss

OTHER = (
    "handgrad step, products through "
    + ("torch.addmm" if matmul.ONEDNN else "oneDNN")
    + ("" if matmul.AVAILABLE else " (not in this torch: addmm)")
)


CPU = torch.device("cpu")


def build(seq: int, batch: int, inp: int, hidden: int, layers: int, vocab: int, device=CPU):
    torch.manual_seed(0)
    lstm, head = LSTM(inp, hidden, layers), Linear(hidden, vocab)
    twin_lstm, twin_head = lstm.to_torch().to(device), head.to_torch().to(device)
    lstm.to(device), head.to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(seq, batch, inp, generator=g).to(device)  # (T, N, E) stand-in for the embedding's output
    y = torch.randint(0, vocab, (seq * batch,), generator=g).to(device)  # (T*N,) next characters
    return lstm, head, twin_lstm, twin_head, x, y


def compiled_candidates(seq, batch, inp, hidden, layers, vocab) -> dict:
    """--compile: the hand-written step under torch.compile(fullgraph=True) (the recurrent layers then run
    kernels/recurrent/graph.py), and the nn.LSTM step with the model under torch.compile, each on a model of its
    own."""
    lstm, head, twin_lstm, twin_head, x, y = build(seq, batch, inp, hidden, layers, vocab)
    opt = optimizers.AdamW(lstm.parameters() + head.parameters(), lr=1e-3)
    crit = CrossEntropyLoss()
    T, N, H = seq, batch, hidden

    def hand_step():
        opt.zero_grad()
        out, _ = lstm(x)
        crit(head(out.view(T * N, H)), y)
        dx = lstm.backward(head.backward(crit.backward()).view(T, N, H))  # (T, N, E), for an embedding below
        opt.step()
        return dx

    opt_t = torch.optim.AdamW([*twin_lstm.parameters(), *twin_head.parameters()], lr=1e-3)
    xr = x.clone().requires_grad_()

    @torch.compile
    def twin_loss(inp):  # the model's forward and loss, compiled as PyTorch users compile a model
        out, _ = twin_lstm(inp)
        return F.cross_entropy(twin_head(out.view(T * N, H)), y)

    def torch_step():
        opt_t.zero_grad()
        twin_loss(xr).backward()
        opt_t.step()
        xr.grad = None

    return {
        "handgrad step under torch.compile (fullgraph)": torch.compile(hand_step, fullgraph=True),
        "nn.LSTM step, forward under torch.compile": torch_step,
    }


def candidates(seq, batch, inp, hidden, layers, vocab, device=CPU) -> dict:
    """The two steps and, on the CPU, the hand-written step's parts (the oneDNN products are the CPU's)."""
    lstm, head, twin_lstm, twin_head, x, y = build(seq, batch, inp, hidden, layers, vocab, device)
    params = lstm.parameters() + head.parameters()
    opt = optimizers.AdamW(params, lr=1e-3)
    crit = CrossEntropyLoss()
    opt_t = torch.optim.AdamW([*twin_lstm.parameters(), *twin_head.parameters()], lr=1e-3)
    xr = x.clone().requires_grad_()
    T, N, H = seq, batch, hidden

    def hand_step():
        opt.zero_grad()
        out, _ = lstm(x)  # (T, N, H)
        crit(head(out.view(T * N, H)), y)
        dx = lstm.backward(head.backward(crit.backward()).view(T, N, H))  # (T, N, E), for an embedding below
        opt.step()
        return dx

    def hand_step_other():  # the products the other way: oneDNN where the default is addmm, and the reverse
        before = matmul.ONEDNN
        matmul.ONEDNN = not before and matmul.AVAILABLE
        try:
            hand_step()
        finally:
            matmul.ONEDNN = before

    def torch_step():
        opt_t.zero_grad()
        out, _ = twin_lstm(xr)
        F.cross_entropy(twin_head(out.view(T * N, H)), y).backward()
        opt_t.step()
        xr.grad = None

    if device.type != "cpu":  # on a GPU: handgrad's step vs nn.LSTM's (cuDNN's fused kernel), nothing else
        return {"handgrad step": hand_step, "nn.LSTM step": torch_step}
    dout = torch.randn(T, N, H) * 1e-3

    def lstm_forward():
        lstm(x)

    def lstm_forward_backward():
        lstm(x)
        lstm.backward(dout)

    def head_and_loss():
        crit(head(dout.view(T * N, H)), y)
        head.backward(crit.backward())

    def adamw():
        opt.step()

    # The matrix products alone, as the LSTM calls them (kernels/recurrent/bptt.py), on the same shapes.
    ws = [
        (
            getattr(lstm, f"weight_ih_l{k}"),
            getattr(lstm, f"weight_hh_l{k}"),
            getattr(lstm, f"bias_ih_l{k}") + getattr(lstm, f"bias_hh_l{k}"),
        )
        for k in range(layers)
    ]
    ins = [x.reshape(T * N, inp)] + [torch.randn(T * N, H) for _ in range(layers - 1)]
    A, h = torch.randn(T, N, 4 * H), torch.randn(T + 1, N, H)
    dA, dy = torch.randn(T * N, 4 * H), torch.randn(T, N, H)

    def input_projections():
        for (w_ih, _, b), xin in zip(ws, ins, strict=True):
            matmul.linear(xin, w_ih, b)

    def recurrent_forward():
        for _, w_hh, _ in ws:
            w = matmul.prepack(w_hh, h[0])
            for t in range(T):
                matmul.linear_add(h[t], w, A[t])

    def recurrent_backward():
        dA3 = dA.view(T, N, 4 * H)
        for _, w_hh, _ in ws:
            w_t = matmul.prepack(w_hh.t().contiguous(), dA3[0])
            for t in range(T):
                matmul.linear_add(dA3[t], w_t, dy[t])

    def weight_gradients():  # as the layer template computes them into a fresh .grad (zero_grad set it to None)
        for (w_ih, _, _), xin in zip(ws, ins, strict=True):
            for g in (matmul.weight_grad(dA, xin), matmul.weight_grad(dA, h[:T].reshape(T * N, H))):  # dW_ih, dW_hh
                g.a @ g.b if isinstance(g, Product) else g()
            dA.sum(0).clone()  # db_ih and db_hh: one sum, a copy of it for the second bias
            matmul.linear(dA, w_ih.t().contiguous())  # dx

    return {
        "handgrad step": hand_step,
        "nn.LSTM step": torch_step,
        OTHER: hand_step_other,
        "LSTM forward": lstm_forward,
        "LSTM forward + backward": lstm_forward_backward,
        "head: Linear + cross-entropy, fwd + bwd": head_and_loss,
        "AdamW step": adamw,
        "input projections (1 GEMM per layer)": input_projections,
        "recurrent products, forward (T per layer)": recurrent_forward,
        "recurrent products, backward (T per layer)": recurrent_backward,
        "weight-gradient, dx and bias reductions": weight_gradients,
    }


def main(argv=None) -> int:
    ap = timing.parser(__doc__, clock=True)
    ap.add_argument("--seq", type=int, default=64, help="T, time steps")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--input", type=int, default=64, help="E, the LSTM's input size (the embedding's width)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=65)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--compile",
        action="store_true",
        help="add the hand-written step under torch.compile(fullgraph=True) and the nn.LSTM step with its "
        "forward compiled (each compiles in the warm-up rounds: minutes at the default shape)",
    )
    a = ap.parse_args(argv)
    if a.device.type != "cpu" and a.compile:
        ap.error(f"--compile: on {a.device} this benchmark times the two eager steps only; leave --compile out")
    print(timing.machine(a.device, a.clock))
    load = os.getloadavg()[0]
    cands = candidates(a.seq, a.batch, a.input, a.hidden, a.layers, a.vocab, a.device)
    if a.compile:
        cands.update(compiled_candidates(a.seq, a.batch, a.input, a.hidden, a.layers, a.vocab))
    t = interleaved(cands, a.repeats, a.warmup, a.device, clock=a.clock)
    load_after = os.getloadavg()[0]
    where = "CPU" if a.device.type == "cpu" else f"{a.device} (nn.LSTM: cuDNN)"
    print(
        f"torch {torch.__version__}, {where}, {torch.get_num_threads()} threads, float32, oneDNN products: "
        f"{matmul.ONEDNN}; load average {load:.2f} before, {load_after:.2f} after"
    )
    print(
        f"LSTM({a.input}, {a.hidden}, num_layers={a.layers}) + Linear({a.hidden}, {a.vocab}), T {a.seq}, batch "
        f"{a.batch}: median of {a.repeats} interleaved rounds"
    )
    ref = t["nn.LSTM step"]
    print(f"  {'candidate':<46}{'ms':>9}{'vs nn.LSTM':>12}")
    shown = (
        "handgrad step",
        "nn.LSTM step",
        OTHER,
        "handgrad step under torch.compile (fullgraph)",
        "nn.LSTM step, forward under torch.compile",
    )
    for name in (n for n in shown if n in t):
        print(f"  {name:<46}{t[name] * 1e3:>9.2f}{ref / t[name]:>11.2f}x")
    if a.device.type != "cpu":
        return 0
    fwd, fb = t["LSTM forward"], t["LSTM forward + backward"]
    bwd = fb - fwd
    rows = [
        ("LSTM forward", fwd),
        ("  input projections", t["input projections (1 GEMM per layer)"]),
        ("  recurrent products", t["recurrent products, forward (T per layer)"]),
        (
            "  the rest: gate arithmetic, Python",
            fwd - t["input projections (1 GEMM per layer)"] - t["recurrent products, forward (T per layer)"],
        ),
        ("LSTM backward (forward + backward - forward)", bwd),
        ("  recurrent products", t["recurrent products, backward (T per layer)"]),
        ("  weight-gradient and dx products, bias sums", t["weight-gradient, dx and bias reductions"]),
        (
            "  the rest: gate derivatives, factors, Python",
            bwd - t["recurrent products, backward (T per layer)"] - t["weight-gradient, dx and bias reductions"],
        ),
        ("head: Linear + cross-entropy, fwd + bwd", t["head: Linear + cross-entropy, fwd + bwd"]),
        ("AdamW step", t["AdamW step"]),
    ]
    print(f"\n  the hand-written step's parts (timed separately in the same run){'':<4}{'ms':>9}{'of step':>10}")
    for name, v in rows:
        print(f"  {name:<70}{v * 1e3:>9.2f}{v / t['handgrad step']:>9.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
