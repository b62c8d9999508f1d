"""One training iteration of the hand-written GPT vs its nn.Module twin (forward, loss, backward, clip, AdamW),
interleaved in one process, with peak memory and where the hand-written iteration's time goes.

    python benchmarks/gpt_step.py [--device cuda] [--dtype bfloat16] [--preset default|gpt2-small] [--repeats 30]
                                  [--glibc-default] [--fused] [--profile]

The default preset is nanoGPT's CPU configuration and train.py's --model gpt default (n_layer 4, n_head 4,
n_embd 128, block_size 64, batch 12, vocab 65); gpt2-small is 12 layers of 768 with a 1024 window (a GPU's shape).
"speed vs twin" = t_twin / t_handgrad (> 1 is faster); tokens/s = batch x block_size / t.  ``--compile`` adds the
twin under torch.compile (the model, as PyTorch users compile it) and handgrad's whole iteration under
torch.compile(fullgraph=True).  Each hand-written row has a twin row "activations held": the same step with
``GPT.recompute = False`` (the LayerNorms' and GELU's outputs held from forward to backward, as autograd holds
them, instead of computed again).  ``--fused`` adds handgrad's eager iteration with the fused kernels on
(kernels/compiled.py: GELU's and LayerNorm's backward each one compiled pass), on a model of its own.
Peak memory: the most tensor memory one iteration held at once (benchmarks/memory.py); on the CPU the weights,
gradients and optimizer state count from the first operation that touches them (both sides alike: the
hand-written step keeps its gradients between steps and zeroes them first, the twin's are allocated in backward).
By default glibc keeps freed memory, as train.py has it (benchmarks/timing.py); --glibc-default leaves it be.
The breakdown times each kind of layer's forward+backward inside the hand-written iteration (torch.profiler).
"""

from __future__ import annotations

import sys

import timing
import torch
import torch.nn.functional as F
from memory import peak_mb  # sibling scripts: benchmarks/ is sys.path[0] when a script here runs
from timing import interleaved

from losses import CrossEntropyLoss
from models import GPT
from optimizers import AdamW, clip_grad_norm_

PRESETS = {
    "default": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch=12, vocab_size=65),
    "gpt2-small": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, batch=8, vocab_size=50304),
}


def build(cfg: dict, device, dtype):
    torch.manual_seed(0)
    model = GPT(
        vocab_size=cfg["vocab_size"],
        block_size=cfg["block_size"],
        n_layer=cfg["n_layer"],
        n_head=cfg["n_head"],
        n_embd=cfg["n_embd"],
        device=device,
        dtype=dtype,
    )
    twin = model.to_torch()

    def groups(named):  # decay the matrices, not the biases and norms' gains
        return [
            {"params": [p for _, p in named if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
        ]

    opt = AdamW(groups(list(model.named_parameters())), lr=1e-3, betas=(0.9, 0.99))
    opt_t = torch.optim.AdamW(groups(list(twin.named_parameters())), lr=1e-3, betas=(0.9, 0.99))
    return model, twin, opt, opt_t


def hand_step(model, opt, x, y, V: int):
    crit = CrossEntropyLoss()

    def handgrad():
        opt.zero_grad(set_to_none=False)
        logits = model(x)
        crit(logits.view(-1, V), y.view(-1))
        model.backward(crit.backward().view_as(logits))
        clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return handgrad


def with_fused_kernels(step):
    """``step`` run with the compiled kernels on (kernels/compiled.py)."""
    from kernels import compiled

    def fused_step():
        with compiled.kernels():
            step()

    return fused_step


def steps(model, twin, opt, opt_t, x, y, V: int, compiled=None, hand_compiled=None, hand_fused=None, extra=None):
    """The candidates, name -> step; ``extra``: more hand-written rows, added after the first two."""
    handgrad = hand_step(model, opt, x, y, V)

    def make_twin(fwd):
        def twin_step():
            opt_t.zero_grad()
            F.cross_entropy(fwd(x).view(-1, V), y.view(-1)).backward()
            torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
            opt_t.step()

        return twin_step

    cands = {"handgrad GPT + handgrad AdamW": handgrad, "nn.Module twin + torch.optim.AdamW": make_twin(twin)}
    cands.update(extra or {})
    if hand_fused is not None:
        cands["handgrad eager, fused kernels"] = hand_fused
    if hand_compiled is not None:
        cands["handgrad under torch.compile (fullgraph)"] = hand_compiled
    if compiled is not None:
        cands["twin under torch.compile"] = make_twin(compiled)
    return cands


def breakdown(model, x, y, V: int) -> list[tuple[str, float]]:
    """Seconds per kind of work in one hand-written iteration: each layer kind's forward and backward, the
    loss, the optimizer (record_function ranges around the calls)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from models import gpt as gpt_module

    kinds = {
        "attention (q/k/v + blocked attention + projection)": gpt_module.CausalSelfAttention,
        "MLP (c_fc, GELU, c_proj)": gpt_module.MLP,
        "LayerNorm": gpt_module.LayerNorm,
        "Embedding": gpt_module.Embedding,
    }
    originals = {}
    for label, cls in kinds.items():
        for meth in ("forward", "backward"):
            orig = getattr(cls, meth)
            originals[(cls, meth)] = orig

            def wrapped(self, *a, __orig=orig, __label=label, **kw):
                with record_function(__label):
                    return __orig(self, *a, **kw)

            setattr(cls, meth, wrapped)
    crit = CrossEntropyLoss()
    opt = AdamW(model.parameters(), lr=1e-3)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                opt.zero_grad(set_to_none=False)
                logits = model(x)
                with record_function("loss + output projection (logits = x @ wte^T)"):
                    crit(logits.view(-1, V), y.view(-1))
                    d = crit.backward().view_as(logits)
                model.backward(d)
                with record_function("clip + AdamW"):
                    clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
    finally:
        for (cls, meth), orig in originals.items():
            setattr(cls, meth, orig)
    totals = {}
    for e in prof.key_averages():
        if e.key in kinds or e.key.startswith(("loss", "clip")):
            totals[e.key] = e.cpu_time_total / 5 / 1e6
    return sorted(totals.items(), key=lambda kv: -kv[1])


def top_ops(fn, device, n: int = 12) -> str:
    """The ``n`` operators that took the most time of three calls of ``fn`` (on a GPU the kernels' own device
    time, on the CPU the operators' own CPU time), as torch.profiler's table, per call."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(3):
            fn()
        sync()
    events = prof.key_averages()
    for key in ("self_device_time_total", "self_cuda_time_total") if cuda else ("self_cpu_time_total",):
        try:
            return events.table(sort_by=key, row_limit=n, max_name_column_width=48)
        except (AttributeError, KeyError, ValueError):  # the name of the device column changed between versions
            continue
    return events.table(row_limit=n)


def main(argv: list[str] | None = None) -> int:
    ap = timing.parser(__doc__, clock=True)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16"))
    ap.add_argument("--preset", choices=tuple(PRESETS), default="default")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument(
        "--compile",
        action="store_true",
        help="also the twin under torch.compile, and handgrad's iteration compiled whole",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also where each eager iteration's time goes, operator by operator (torch.profiler: on a GPU "
        "each kernel's device time), for the hand-written iteration and the twin's",
    )
    ap.add_argument(
        "--fused",
        action="store_true",
        help="also handgrad's eager iteration with the compiled kernels on (kernels/compiled.py)",
    )
    args = ap.parse_args(argv)
    device = args.device
    cfg = dict(PRESETS[args.preset])
    if args.batch:
        cfg["batch"] = args.batch
    dtype = getattr(torch, args.dtype)
    model, twin, opt, opt_t = build(cfg, device, dtype)
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["block_size"]), generator=g, device=device)
    y = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["block_size"]), generator=g, device=device)
    V = cfg["vocab_size"]

    def held(label: str, wrap=lambda step: step):
        """A row of its own: handgrad with GPT.recompute = False (the activations held, as autograd holds them)."""
        m, _, o, _ = build(cfg, device, dtype)
        m.recompute = False
        return {f"{label}, activations held": wrap(hand_step(m, o, x, y, V))}

    extra = held("handgrad eager")
    compiled = hand_compiled = None
    if args.compile:  # the twin's model compiled; handgrad's whole iteration, on a model of its own
        compiled = torch.compile(twin)
        model_c, _, opt_c, _ = build(cfg, device, dtype)
        hand_compiled = torch.compile(hand_step(model_c, opt_c, x, y, V), fullgraph=True)
        extra.update(held("handgrad compiled", lambda step: torch.compile(step, fullgraph=True)))
    hand_fused = None
    if args.fused:  # handgrad's eager iteration with the compiled kernels (kernels/compiled.py), on a model of its own
        model_f, _, opt_f, _ = build(cfg, device, dtype)
        hand_fused = with_fused_kernels(hand_step(model_f, opt_f, x, y, V))
        extra.update(held("handgrad fused kernels", with_fused_kernels))
    cands = steps(model, twin, opt, opt_t, x, y, V, compiled, hand_compiled, hand_fused, extra)
    times = interleaved(cands, args.repeats, args.warmup, device, clock=args.clock)
    mems = {name: peak_mb(fn, device) for name, fn in cands.items()}
    print(timing.machine(device, args.clock))
    print(f"{args.dtype}; GPT {cfg}")
    print(f"{'candidate':<44} {'ms/iter':>9} {'tokens/s':>10} {'speed vs twin':>14} {'peak MB':>9}")
    ref = times["nn.Module twin + torch.optim.AdamW"]
    tokens = cfg["batch"] * cfg["block_size"]
    for name, t in times.items():
        print(f"{name:<44} {t * 1e3:>9.2f} {tokens / t:>10.0f} {ref / t:>13.2f}x {mems[name]:>9.1f}")
    if args.profile:
        for name in ("handgrad GPT + handgrad AdamW", "nn.Module twin + torch.optim.AdamW"):
            print(f"\n{name}: the operators that took the most time, over 3 iterations\n{top_ops(cands[name], device)}")
    if device.type == "cpu":
        print("\nwhere the hand-written iteration's time goes (forward + backward of each kind, torch.profiler):")
        for label, sec in breakdown(model, x, y, cfg["vocab_size"]):
            print(f"  {label:<55} {sec * 1e3:>8.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
