"""Attention forward+backward: the blocked (FlashAttention) path vs the textbook path vs torch, in memory and time;
MultiheadAttention and TransformerEncoderLayer vs torch.nn's with autograd.

    python benchmarks/attention.py [--device cuda] [--repeats 10] [--part memory|speed|all]

memory: one forward+backward of attention at T = 1024, 4 heads of 64, batch 4, float32 (``--T``, ``--heads``,
``--head-dim``, ``--batch``), for each of the textbook path (the layer with kernels.disabled(): the (T, T) scores and
probabilities kept for backward), the blocked path (layers.ScaledDotProductAttention: one (T, block) tile at a
time, only the output and log-sum-exps kept) and torch's F.scaled_dot_product_attention under autograd.  Peak
memory is the rise of the process's resident set above what it held once the inputs
existed (sampled every 0.1 ms), each path in a fresh process (so one path's freed memory cannot hide
another's); time is the median
of interleaved rounds in one process.

speed: forward+backward (and the parameter gradients) of MultiheadAttention (self-attention, need_weights=False,
as a transformer calls it) and of TransformerEncoderLayer against torch.nn's under autograd, at a GPT-like shape
(batch 12, T 64, E 128, 4 heads) and at T = 512; "speed vs torch" = t_torch / t_handgrad (> 1 is faster).
"""

from __future__ import annotations

import sys

import timing
import torch
import torch.nn.functional as F
from memory import peak_mb  # sibling scripts: benchmarks/ is sys.path[0] when a script here runs
from timing import interleaved

import kernels
from layers import MultiheadAttention, ScaledDotProductAttention, TransformerEncoderLayer

PATHS = ("textbook", "blocked", "torch")


def attention_step(path: str, q, k, v, dout, causal: bool, block: int | None):
    """A callable running one forward+backward of attention along ``path``."""
    if path == "textbook":  # the layer with the kernels off: the (L, S) matrices kept
        att = ScaledDotProductAttention()

        def run():
            with kernels.disabled():
                att(q, k, v, is_causal=causal)
                return att.backward(dout)
    elif path == "blocked":
        att = ScaledDotProductAttention(block_size=block)

        def run():
            att(q, k, v, is_causal=causal)
            return att.backward(dout)
    else:
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]

        def run():
            out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
            return torch.autograd.grad(out, leaves, dout)

    return run


def inputs(args, device):
    g = torch.Generator(device=device).manual_seed(0)
    shape = (args.batch, args.heads, args.T, args.head_dim)
    return [torch.randn(shape, generator=g, device=device) for _ in range(4)]  # q, k, v, dout


def speed_rows(args, device) -> list[tuple[str, float, float]]:
    return [row for batch, T in ((12, 64), (12, 512)) for row in speed_case(args, device, batch, T)]


def speed_case(args, device, batch: int, T: int) -> list[tuple[str, float, float]]:
    """One shape's two rows: the closures timed below share this call's layers and tensors."""
    E, H = 128, 4
    torch.manual_seed(0)
    mha = MultiheadAttention(E, H, device=device)
    mha_t = mha.to_torch()
    layer = TransformerEncoderLayer(E, H, dim_feedforward=4 * E, dropout=0.0, norm_first=True, device=device)
    layer_t = layer.to_torch()
    x = torch.randn(T, batch, E, device=device)
    dout = torch.randn(T, batch, E, device=device)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T, device=device)

    def ours_mha():
        mha(x, x, x, need_weights=False, attn_mask=mask, is_causal=True)
        mha.backward(dout, summed=True)
        mha.zero_grad()

    def torch_mha():
        xt = x.clone().requires_grad_(True)
        out, _ = mha_t(xt, xt, xt, need_weights=False, attn_mask=mask, is_causal=True)
        out.backward(dout)
        mha_t.zero_grad()

    def ours_layer():
        layer(x, src_mask=mask, is_causal=True)
        layer.backward(dout)
        layer.zero_grad()

    def torch_layer():
        xt = x.clone().requires_grad_(True)
        layer_t(xt, src_mask=mask, is_causal=True).backward(dout)
        layer_t.zero_grad()

    t = interleaved(
        {"mha": ours_mha, "mha_t": torch_mha, "layer": ours_layer, "layer_t": torch_layer},
        args.repeats,
        3,
        device,
        clock=args.clock,
    )
    return [
        (f"MultiheadAttention, causal self-attention, B {batch}, T {T}, E {E}, {H} heads", t["mha"], t["mha_t"]),
        (f"TransformerEncoderLayer (pre-norm, FF {4 * E}), B {batch}, T {T}", t["layer"], t["layer_t"]),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = timing.parser(__doc__, clock=True)
    ap.add_argument("--part", choices=("memory", "speed", "all"), default="all")
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--block", type=int, default=None, help="the blocked path's keys per block (default: the layer's)")
    ap.add_argument("--causal", action="store_true", help="causal attention in the memory/time comparison")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    device = args.device
    print(timing.machine(device, args.clock))
    if args.part in ("memory", "all"):
        q, k, v, dout = inputs(args, device)
        times = interleaved(
            {p: attention_step(p, q, k, v, dout, args.causal, args.block) for p in PATHS},
            args.repeats,
            2,
            device,
            clock=args.clock,
        )
        peaks = {p: peak_mb(attention_step(p, q, k, v, dout, args.causal, args.block), device) for p in PATHS}
        print(
            f"\nattention forward+backward, B {args.batch}, {args.heads} heads of {args.head_dim}, T {args.T}, "
            f"float32{', causal' if args.causal else ''}"
        )
        print(f"{'path':<44} {'ms':>8} {'vs textbook':>12} {'peak MB':>9} {'vs textbook':>12}")
        names = {
            "textbook": "textbook (the kernels off, T x T kept)",
            "blocked": "blocked (layers.ScaledDotProductAttention)",
            "torch": "torch F.scaled_dot_product_attention+autograd",
        }
        for p in PATHS:
            mem = f"{peaks[p]:>9.1f} {peaks[p] / peaks['textbook']:>11.2f}x" if peaks else f"{'-':>9} {'-':>12}"
            print(f"{names[p]:<44} {times[p] * 1e3:>8.2f} {times[p] / times['textbook']:>11.2f}x {mem}")
    if args.part in ("speed", "all"):
        print("\nforward+backward vs torch.nn with autograd (speed vs torch = t_torch / t_handgrad)")
        print(f"{'what':<66} {'handgrad ms':>12} {'torch ms':>10} {'speed vs torch':>15}")
        for name, ours, theirs in speed_rows(args, device):
            print(f"{name:<66} {ours * 1e3:>12.2f} {theirs * 1e3:>10.2f} {theirs / ours:>14.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
