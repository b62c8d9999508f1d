"""Every Triton kernel of kernels/triton/ compiled for NVIDIA GPUs on a machine without one: what Triton's interpreter
cannot check, asked of the GPU's own compiler.

    python scripts/triton_compile.py                  # every configuration below, for sm_80 (A100) and sm_90 (H100)
    python scripts/triton_compile.py --quick          # bfloat16 and float32 at head width 64, sm_90 only
    python scripts/triton_compile.py --allow-spills   # report register spills without failing

The wrappers are called as the layers would call them, at GPT-2 small's shapes (and head width 128), in float16,
bfloat16, float32 and float64; each kernel launch they make is recorded instead of run (the tensors are CPU tensors
never touched), then compiled ahead of time by Triton's compiler down to a cubin (with the ptxas Triton ships), with
the signature, the constants and the 16-byte alignments a launch on a GPU would give it.  The cubin's registers and
spilled bytes (cuobjdump --dump-resource-usage) and the shared memory it needs are printed, one line a kernel.
Exits 1 if a kernel does not compile, needs more shared memory than the architecture gives a block, or spills
registers (unless --allow-spills).  Nothing here measures speed: that needs the GPU (benchmarks/kernels_triton.py).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}  # bytes of shared memory a block may have
B, H, T, C, V = 8, 12, 1024, 768, 50257  # GPT-2 small at batch 8


def record_launches(kernels, dtypes, widths):
    """[(jit function, args, kwargs), ...]: the launches the wrappers make, recorded by a JITFunction.run that runs
    nothing.  The wrappers' device check is told these CPU tensors are fine, and no bfloat16 product is upcast (that
    is for the interpreter only)."""
    import torch
    from triton.runtime.jit import JITFunction

    import kernels.triton._common as common

    common.interpreted = lambda kernel: True  # accept CPU tensors: nothing is launched
    from kernels.triton import adamw, attention, cross_entropy, gelu, layernorm

    attention.upcast_dots = lambda kernel, dtype: False

    calls = []
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: calls.append((self, args, kwargs))
    for dtype in dtypes:
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        if "attention" in kernels:
            for width in widths:
                q = torch.empty(B, H, T, width, dtype=dtype)
                out, lse = attention.flash_attention_forward(q, q, q, causal=True)
                attention.flash_attention_backward(q, q, q, q, out, lse, causal=True)
        if "layernorm" in kernels:
            x, w = torch.empty(B * T, C, dtype=dtype), torch.empty(C, dtype=dtype)
            out, mean, rstd = layernorm.layer_norm_forward(x, w, w)
            layernorm.layer_norm_backward(x, x, w, w, mean, rstd)
        if "gelu" in kernels:
            x = torch.empty(B * T, 4 * C, dtype=dtype)
            gelu.gelu_forward(x)
            gelu.gelu_backward(x, x, approximate="tanh")
        if "cross_entropy" in kernels:
            z, y = torch.empty(B * T, V, dtype=dtype), torch.zeros(B * T, dtype=torch.int64)
            loss, lse = cross_entropy.cross_entropy_forward(z, y)
            cross_entropy.cross_entropy_backward(1.0, z, y, lse)
            cross_entropy.cross_entropy_forward_backward(z, y)
        if "adamw" in kernels and dtype in (torch.float32, torch.float64):
            p = torch.zeros(124_439_808 // 64, dtype=acc)
            adamw.adamw_step(p, p, p, p, step=1, lr=1e-3)
    return calls


def compile_launch(fn, args, kwargs, arch: int):
    """The launch compiled for sm_<arch> as a GPU launch would compile it: -> Triton's compiled kernel."""
    import torch
    import triton
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    # strict=False: the launch passes the first arguments by position, the rest by name
    bound = {**dict(zip(names, args, strict=False)), **{k: v for k, v in kwargs.items() if k in names}}
    options = {k: v for k, v in kwargs.items() if k not in names}
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(names):
        value = bound[name]
        if fn.params[i].is_constexpr:
            signature[name], constants[name] = "constexpr", value
            continue
        kind, key = native_specialize_impl(BaseBackend, value, False, True, True)
        if kind == "constexpr":  # an int equal to 1
            signature[name], constants[name] = "constexpr", value
            continue
        if isinstance(value, torch.Tensor):
            key = "D"  # the CUDA caching allocator aligns every tensor to 16 bytes and more
        signature[name] = kind
        if key:
            attrs[(i,)] = BaseBackend.parse_attr(key)
    return triton.compile(
        ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", arch, 32), options=options
    )


def resources(cubin: bytes, cuobjdump: str) -> tuple[int, int]:
    """(registers a thread, bytes spilled to the stack) of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(
            [cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", out)
    if not m:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{out}")
    return int(m.group(1)), int(m.group(2))


def describe(kwargs) -> str:
    keep = (
        "CAUSAL",
        "BACKWARD",
        "FORWARD",
        "TANH",
        "HAS_W",
        "BLOCK_M",
        "BLOCK_N",
        "BLOCK_E",
        "BLOCK_K",
        "BLOCK_C",
        "BLOCK",
        "num_warps",
    )
    return " ".join(f"{k}={v}" for k, v in kwargs.items() if k in keep)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="bfloat16 and float32, head width 64, sm_90 only")
    ap.add_argument(
        "--arch",
        type=int,
        nargs="+",
        choices=sorted(SHARED_LIMIT),
        default=None,
        help="compute capabilities to compile for (default: 80 90; --quick: 90)",
    )
    ap.add_argument(
        "--kernels",
        default="attention,layernorm,gelu,cross_entropy,adamw",
        help="a comma-separated subset of attention,layernorm,gelu,cross_entropy,adamw",
    )
    ap.add_argument("--allow-spills", action="store_true", help="report register spills without failing")
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        ap.exit(
            2,
            "triton_compile.py: error: TRITON_INTERPRET is set: the kernels would be defined for the "
            "interpreter, not the compiler; unset it\n",
        )
    try:
        import torch
        import triton
    except ImportError as e:
        ap.exit(2, f"triton_compile.py: error: {e} (pip install triton; torch's CUDA wheels bring it)\n")
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        ap.exit(2, f"triton_compile.py: error: this Triton has no NVIDIA backend tools ({cuobjdump} is missing)\n")
    sys.path.insert(0, str(ROOT))
    arches = a.arch or ([90] if a.quick else [80, 90])
    dtypes = (
        [torch.bfloat16, torch.float32] if a.quick else [torch.float16, torch.bfloat16, torch.float32, torch.float64]
    )
    widths = [64] if a.quick else [64, 128]
    kernels = a.kernels.split(",")
    calls = record_launches(kernels, dtypes, widths)
    seen, failed = set(), []
    print(
        f"Triton {triton.__version__}: {len(calls)} launches recorded, compiled for "
        + ", ".join(f"sm_{x}" for x in arches)
    )
    for fn, args, kwargs in calls:
        dtypes_of = tuple(str(x.dtype).replace("torch.", "") for x in args if isinstance(x, torch.Tensor))
        key = (fn.__name__, dtypes_of, describe(kwargs), tuple(sorted(str(v) for k, v in kwargs.items())))
        if key in seen:
            continue
        seen.add(key)
        for arch in arches:
            what = f"sm_{arch} {fn.__name__} {dtypes_of[0]} {describe(kwargs)}"
            try:
                compiled = compile_launch(fn, args, kwargs, arch)
            except Exception as e:  # a compile failure is the finding: say which and go on to the others
                failed.append(f"{what}: does not compile: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
                print(f"{what}: DOES NOT COMPILE ({type(e).__name__})", flush=True)
                continue
            regs, spilled = resources(compiled.asm["cubin"], str(cuobjdump))
            shared = compiled.metadata.shared
            problems = []
            if shared > SHARED_LIMIT[arch]:
                problems.append(f"needs {shared} B of shared memory, sm_{arch} gives a block {SHARED_LIMIT[arch]}")
            if spilled and not a.allow_spills:
                problems.append(f"spills {spilled} B of registers")
            failed += [f"{what}: {p}" for p in problems]
            print(
                f"{what}: {regs} registers, {spilled} B spilled, {shared} B shared"
                + (f"  <- {'; '.join(problems)}" if problems else ""),
                flush=True,
            )
    for line in failed:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
