"""Every GPU figure in one run on one device: the MLP step, the GPT at GPT-2-small's shape, the LSTM vs cuDNN,
mixed precision's loss-scale path and train.py end to end, each the sibling script that measures it on the CPU.

    python benchmarks/gpu.py                          # every section, on cuda
    python benchmarks/gpu.py --only mlp,gpt-eager     # some sections
    python benchmarks/gpu.py --device cpu --quick     # tiny sizes: checks the script itself on any machine

Sections (each command runs as its own process with a time limit, so one that fails or runs long costs only
itself; the table at the end says how each ended).  They run in the order of the list in ``sections``: what the
goals need first, so a run cut short by --budget still has them.
  mlp             benchmarks/step.py: the small, then the default MLP's step, hand-written eager, captured as a
                  CUDA graph and compiled whole, vs nn.Module eager and compiled, and the GEMM-only bound
  gpt-eager       benchmarks/gpt_step.py --preset gpt2-small (12 layers of 768, 12 heads, block 1024, batch 8) in
                  float32 and in bfloat16: hand-written vs its twin, tokens/s and peak memory, and (bfloat16)
                  the kernels that took the most device time in each
  gpt-compiled    the same with --compile, bfloat16 then float32: both iterations under torch.compile (it did not
                  finish within 4 minutes on an H200 with torch 2.11: run it alone, --only gpt-compiled)
  lstm            benchmarks/lstm_step.py: the character LSTM step at two sizes, hand-written vs nn.LSTM (cuDNN)
  precision       benchmarks/precision.py: bfloat16 and float16 (with its dynamic loss scale) vs autocast
  train           train.py --dataset fashion-mnist --epochs 2 on the device, end to end, beside its twin
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import timing  # a sibling script: benchmarks/ is sys.path[0] when a script here runs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def sections(device: str, quick: bool, data_dir: str, out: str) -> list[tuple[str, list[str], int]]:
    """[(section, argv after the interpreter, seconds allowed), ...], in the order they run."""
    dev = ["--device", device]
    gpt = (
        ["--preset", "default", "--repeats", "2", "--warmup", "1"]
        if quick
        else ["--preset", "gpt2-small", "--repeats", "20"]
    )
    mlp = ["--repeats", "3", "--warmup", "4"] if quick else ["--repeats", "300"]
    lstm = ["--repeats", "2", "--warmup", "1", "--seq", "8"] if quick else ["--repeats", "50"]
    return [
        ("mlp", [str(HERE / "step.py"), *dev, "--nets", "small", "--compile", "default", *mlp], 180),
        ("gpt-eager", [str(HERE / "gpt_step.py"), *dev, *gpt, "--dtype", "float32"], 90),
        ("gpt-eager", [str(HERE / "gpt_step.py"), *dev, *gpt, "--dtype", "bfloat16", "--profile"], 90),
        ("gpt-compiled", [str(HERE / "gpt_step.py"), *dev, *gpt, "--dtype", "bfloat16", "--compile"], 420),
        ("lstm", [str(HERE / "lstm_step.py"), *dev, *lstm], 60),
        ("lstm", [str(HERE / "lstm_step.py"), *dev, *lstm, "--hidden", "1024", "--input", "256", "--batch", "64"], 60),
        (
            "precision",
            [
                str(HERE / "precision.py"),
                *dev,
                "--dtypes",
                "bfloat16",
                "float16",
                *(["--repeats", "2", "--hidden", "64"] if quick else ["--repeats", "100"]),
            ],
            60,
        ),
        ("mlp", [str(HERE / "step.py"), *dev, "--nets", "default", "--compile", "default", *mlp], 180),
        (
            "train",
            [
                str(ROOT / "train.py"),
                "--dataset",
                "fashion-mnist",
                "--epochs",
                "1" if quick else "2",
                *dev,
                "--data-dir",
                data_dir,
                "--no-download",
                "--out",
                out,
                "--overwrite",
                "--no-plots",
                *(["--limit-train", "512"] if quick else []),
            ],
            240,
        ),
        ("gpt-compiled", [str(HERE / "gpt_step.py"), *dev, *gpt, "--dtype", "float32", "--compile"], 420),
    ]


def run(argv: list[str], limit: int) -> tuple[str, float]:
    """Run one command with the project on the path, its output passed through; how it ended and its seconds."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }
    print(
        f"\n$ python {' '.join(os.path.relpath(a, ROOT) if a.startswith(str(ROOT)) else a for a in argv)}", flush=True
    )
    t0 = time.perf_counter()
    try:
        rc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, timeout=limit).returncode
        how = "ok" if rc == 0 else f"exit {rc}"
    except subprocess.TimeoutExpired:
        how = f"stopped at its {limit} s limit"
    return how, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = timing.parser(__doc__, clock=False)
    ap.add_argument("--only", default=None, help="comma-separated sections (default: all, in the order above)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few repeats: checks that each section runs")
    ap.add_argument("--data-dir", default="data", help="where train.py finds Fashion-MNIST (default: data)")
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop starting sections once this much time has passed; each gets at most what is left",
    )
    args = ap.parse_args(argv)
    device = str(args.device)
    if args.device.type == "cuda":
        import torch

        device = f"cuda:{torch.cuda.current_device() if args.device.index is None else args.device.index}"
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        table = sections(device, args.quick, args.data_dir, str(Path(tmp) / "train"))
        known = list(dict.fromkeys(name for name, _, _ in table))
        names = args.only.split(",") if args.only else known
        unknown = [n for n in names if n not in known]
        if unknown:
            ap.error(f"--only: unknown section(s) {unknown}; known: {', '.join(known)}")
        print(timing.machine(args.device))
        ended = []
        for name, cmd, limit in table:
            if name not in names:
                continue
            what = " ".join(a for a in cmd[1:] if not a.startswith(str(ROOT)))
            left = None if args.budget is None else args.budget - (time.perf_counter() - t_start)
            if left is not None and left < 20:
                ended.append((name, what, "not started: budget spent", 0.0))
                continue
            how, sec = run(cmd, limit if left is None else int(min(limit, left)))
            ended.append((name, what, how, sec))
    print(f"\n{'section':<14}{'seconds':>9}  {'how it ended':<28}arguments")
    for name, what, how, sec in ended:
        print(f"{name:<14}{sec:>9.1f}  {how:<28}{what}")
    return 0 if all(how == "ok" for _, _, how, _ in ended) else 1


if __name__ == "__main__":
    sys.exit(main())
