"""The front page's figures, measured on this machine and written down in one table: ``docs/figures.md``, each
figure with its value, the command whose output gave it, the machine and the date; the README's figures are
rendered from that table into its marked sections, never typed by hand.

    python scripts/figures.py                     # measure every group (about half an hour on a quiet 2-core CPU)
    python scripts/figures.py --only speed tests  # measure some groups again; the other rows stay as they are
    python scripts/figures.py --render            # only write the README's sections from docs/figures.md

Groups: agreement (gradcheck.py, the GPT against nanoGPT's model.py), training (the main job, 10 epochs, and one
epoch in float64), speed (the benchmark scripts, one thread), learn (``learn check`` of a right answer), tests
(both of the README's test commands: counts, times, what the skipped ones need), install (the environment's
size, measured on the .venv the README's set-up made).  Time it on a quiet machine (``uptime``): each row records
the load average it started under.  tests/test_front_page.py checks that the README says what the table renders.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "figures.md"
README = ROOT / "README.md"
PY = "python"  # how a command is written in the table; it runs with this interpreter
NUMBER = r"(-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)"

HEAD = """# The front page's figures

Every figure on the README's front page, with the command whose output gave it, the machine it ran on and the
date. `python scripts/figures.py` measures them and writes this page and the README's figures (`--only GROUP` for
some of them); `tests/test_front_page.py` checks that the README says what this table says. Ratios are the
hand-written step's speed over its nn.Module twin's, the two interleaved in one run (> 1 is faster).

| key | figure | value | command | machine | date |
|---|---|---|---|---|---|
"""


# -- running a command and reading its own output ------------------------------------------------------------------


def cpu() -> str:
    """The CPU's model name as lscpu gives it, and the cores this process may use."""
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        name = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    return f"{name}, {len(os.sched_getaffinity(0))} cores"


def machine() -> str:
    import torch

    return (
        f"{cpu()}; torch {torch.__version__}, Python {platform.python_version()}; load average "
        f"{os.getloadavg()[0]:.1f} at the start"
    )


def run(command: str, cwd: Path = ROOT, timeout: float = 3600, env: dict | None = None) -> tuple[str, float, str]:
    """Run ``command`` (written with ``python`` for this interpreter) -> (its output, seconds, the machine line)."""
    where = machine()
    words = [sys.executable if w == PY else w for w in shlex.split(command)]
    print(f"$ {command}", flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(
        words,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{command} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr, seconds, where


def find(pattern: str, text: str, command: str) -> re.Match:
    m = re.search(pattern, text, re.M)
    if m is None:
        raise SystemExit(f"{command}: its output has no line matching {pattern!r}; has the script's output changed?")
    return m


def ratio(text: str, candidate: str, command: str) -> float:
    """The first ratio ("1.23x") on the row of ``candidate`` in a benchmark's table."""
    row = find(rf"^\s*{re.escape(candidate)}\s{{2,}}.*$", text, command).group(0)
    return float(find(rf"{NUMBER}x", row, command).group(1))


# -- the groups: each returns rows (key, figure, value, command, machine) --------------------------------------------


def agreement() -> list[tuple]:
    command = f"{PY} gradcheck.py"
    out, seconds, where = run(command)
    m = find(
        rf"^(\d+) passed, 0 failed \(tolerance [^;]+; worst relative error {NUMBER} vs numeric \[[^\]]*\], "
        rf"{NUMBER} vs autograd\)",
        out,
        command,
    )
    rows = [
        ("gradcheck.checks", "checks of every built-in layer, loss and model (float64)", m.group(1)),
        ("gradcheck.autograd", "worst relative error against torch.autograd", f"{float(m.group(3)):.1e}"),
        ("gradcheck.numeric", "worst relative error against central differences", f"{float(m.group(2)):.1e}"),
        ("gradcheck.seconds", "wall time of all checks", f"{seconds:.1f} s"),
    ]
    rows = [(*r, command, where) for r in rows]
    command = f"{PY} examples/gpt_vs_nanogpt.py"
    out, _, where = run(command)
    logits = float(find(rf"^logits\s+{NUMBER}", out, command).group(1))
    grads = float(find(rf"^gradients \(all \d+, worst\) {NUMBER}", out, command).group(1))
    return rows + [
        (
            "nanogpt.logits",
            "the GPT's logits against nanoGPT's model.py (float64, relative)",
            f"{logits:.1e}",
            command,
            where,
        ),
        ("nanogpt.grads", "the GPT's gradients against nanoGPT's (worst, relative)", f"{grads:.1e}", command, where),
    ]


def training() -> list[tuple]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="handgrad-figures-") as tmp:
        command = "python train.py --dataset fashion-mnist"
        out, _, where = run(f"{command} --out {tmp}/main --no-download")
        summary = json.loads((Path(tmp) / "main" / "summary.json").read_text())
        res = summary["results"]
        first = find(rf"the first step agreed, .*?its gradients to {NUMBER}", out, command).group(1)
        hand, twin = res["manual"], res["torch"]
        for key, figure, value in (
            ("main.hand", "test accuracy after 10 epochs, hand-written", f"{100 * hand['test_accuracy']:.2f}%"),
            ("main.twin", "test accuracy after 10 epochs, nn.Module twin", f"{100 * twin['test_accuracy']:.2f}%"),
            ("main.epoch", "seconds per epoch, hand-written", f"{hand['seconds_per_epoch']:.1f} s"),
            ("main.first", "the first step's gradients, largest relative difference (float32)", f"{float(first):.1e}"),
            (
                "main.drift",
                "largest weight difference after 10 epochs (float32)",
                f"{summary['max_param_abs_diff']:.2g}",
            ),
        ):
            rows.append((key, figure, value, command, where))
        command = "python train.py --dataset fashion-mnist --dtype float64 --epochs 1"
        out, _, where = run(f"{command} --out {tmp}/f64 --no-download")
        summary = json.loads((Path(tmp) / "f64" / "summary.json").read_text())
        rows.append(
            (
                "main.f64",
                "largest weight difference after 1 epoch (float64)",
                f"{summary['max_param_abs_diff']:.1e}",
                command,
                where,
            )
        )
    return rows


SPEED = [
    (
        "speed.small",
        "small MLP (hidden 128, batch 64), SGD",
        f"{PY} benchmarks/step.py --nets small --threads 1",
        "handgrad README call, SGD",
    ),
    (
        "speed.default",
        "default MLP (hidden 1024, batch 512), SGD",
        f"{PY} benchmarks/step.py --nets default --threads 1",
        "handgrad README call, SGD",
    ),
    ("speed.cnn", "CNN (batch 128), Adam", f"{PY} benchmarks/cnn_step.py --threads 1", "handgrad CNN + handgrad Adam"),
    (
        "speed.gpt",
        "GPT iteration (nanoGPT's CPU configuration), AdamW",
        f"{PY} benchmarks/gpt_step.py --threads 1",
        "handgrad GPT + handgrad AdamW",
    ),
    (
        "speed.lstm",
        "character LSTM step against nn.LSTM, AdamW",
        f"{PY} benchmarks/lstm_step.py --threads 1",
        "handgrad step",
    ),
]


def speed() -> list[tuple]:
    rows = []
    for key, figure, command, candidate in SPEED:
        out, _, where = run(command)
        rows.append((key, figure, f"{ratio(out, candidate, command):.2f}x", command, where))
    return rows


def learn() -> list[tuple]:
    with tempfile.TemporaryDirectory(prefix="handgrad-figures-") as tmp:
        answer = Path(tmp) / "linear.py"
        run(f"{PY} -m learn start linear --solution --out {answer}")
        command = f"{PY} -m learn check linear"
        times, where = [], None
        for _ in range(3):
            _, seconds, where = run(f"{command} {answer}")
            times.append(seconds)
    return [
        (
            "learn.check",
            "`learn check linear` of a right answer, wall time (median of 3)",
            f"{statistics.median(times):.1f} s",
            command,
            where,
        )
    ]


# what a skipped test needs, by the words of its reason (pytest -ra's "SKIPPED [n] file:line: reason" lines)
NEEDS = {"cuda": "CUDA", "graphviz": "Graphviz", "chromium": "Chromium", "bubblewrap": "bubblewrap"}


def tests() -> list[tuple]:
    rows = []
    for key, command in (("tests.fast", f"{PY} -m pytest -q"), ("tests.slow", f"{PY} -m pytest -q -m slow")):
        # the front page's count test skips itself meanwhile: it compares the counts being measured
        out, seconds, where = run(command, env={"HANDGRAD_COUNTING_TESTS": "1"})
        summary = find(r"^=*\s*(\d+) passed(.*) in [\d.]+s", out, command)
        print(f"  {summary.group(0).strip('= ')}", flush=True)
        skips = re.findall(r"^SKIPPED \[(\d+)\] [^:]+(?::\d+)?: (.*)$", out, re.M)
        rows.append(
            (
                f"{key}.count",
                f"tests `{command}` runs (passed and skipped)",
                str(int(summary.group(1)) + sum(int(n) for n, _ in skips)),
                command,
                where,
            )
        )
        rows.append((f"{key}.time", f"wall time of `{command}`", minutes(seconds), command, where))
        for need, word in NEEDS.items():
            rows.append(
                (
                    f"{key}.skip.{need}",
                    f"tests of `{command}` skipped for want of {word}",
                    str(sum(int(n) for n, why in skips if word.lower() in why.lower())),
                    command,
                    where,
                )
            )
    return rows


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def install() -> list[tuple]:
    """The virtual environment's size, and how much of it is CUDA's libraries (a CPU-only torch leaves them out)."""
    import torch

    command = "du -sm .venv; du -sm .venv/lib/python3*/site-packages/nvidia"
    venv = ROOT / ".venv"
    nvidia = next(venv.glob("lib/python3*/site-packages/nvidia"), None)
    out, _, where = run(f"du -sm {venv}")
    cuda = int(run(f"du -sm {nvidia}")[0].split()[0]) if nvidia else 0  # apart: du counts a folder's files once
    return [
        (
            "install.venv",
            f"the environment the set-up makes (torch {torch.__version__})",
            f"{int(out.split()[0]) / 1024:.1f} GB",
            command,
            where,
        ),
        ("install.cuda", "of which CUDA's libraries", f"{cuda / 1024:.1f} GB", command, where),
    ]


GROUPS = {
    "agreement": agreement,
    "training": training,
    "speed": speed,
    "learn": learn,
    "tests": tests,
    "install": install,
}


# -- the table and the README's sections --------------------------------------------------------------------------


def load(path: Path = TABLE) -> dict[str, dict[str, str]]:
    """key -> {figure, value, command, machine, date} of the table in ``path``."""
    rows = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 6 and cells[0] not in ("key", "---") and not cells[0].startswith("---"):
            key = cells[0].strip("`")
            rows[key] = dict(
                zip(
                    ("figure", "value", "command", "machine", "date"),
                    [cells[1], cells[2], cells[3].strip("`"), cells[4], cells[5]],
                    strict=True,
                )
            )
    return rows


def save(rows: dict[str, dict[str, str]], path: Path = TABLE) -> None:
    lines = [
        f"| `{k}` | {r['figure']} | {r['value']} | `{r['command']}` | {r['machine']} | {r['date']} |"
        for k, r in rows.items()
    ]
    path.write_text(HEAD + "\n".join(lines) + "\n")


SECTIONS = ("install", "tests", "timings", "headline")  # the README's generated sections, in its order


def sections(rows: dict[str, dict[str, str]]) -> dict[str, str]:
    """The README's generated sections: name -> markdown, every number from ``rows``."""
    v = {k: r["value"] for k, r in rows.items()}

    def on(*keys: str) -> str:
        """Where and when the figures of ``keys`` were measured (the machine line up to torch's version)."""
        seen = sorted({(rows[k]["machine"].split(";")[0], rows[k]["date"]) for k in keys})
        return "; ".join(f"{m}, {d}" for m, d in seen)

    timings = "\n".join(
        [
            "| what | time | measured on |",
            "|---|---|---|",
            f"| `learn check linear` (a right answer) | {v['learn.check']} wall | {on('learn.check')} |",
            f"| the main job, 10 epochs | {v['main.epoch']} per epoch | {on('main.epoch')} |",
            f"| the tests: `pytest -q` ({int(v['tests.fast.count']):,} tests), then `-m slow` "
            f"({int(v['tests.slow.count']):,}) | {v['tests.fast.time']}, then {v['tests.slow.time']} | "
            f"{on('tests.fast.time', 'tests.slow.time')} |",
        ]
    )
    headline = "\n".join(
        [
            f"- **Agreement.** `python gradcheck.py` (every built-in layer, loss and model, float64; "
            f"{v['gradcheck.checks']} checks in {v['gradcheck.seconds']}): worst relative error "
            f"{v['gradcheck.autograd']} against autograd and {v['gradcheck.numeric']} against central differences "
            f"(bound 1e-7). The GPT against nanoGPT's own `model.py`: logits {v['nanogpt.logits']}, gradients "
            f"{v['nanogpt.grads']}. In float64 one epoch of the main job leaves hand-written and twin within "
            f"{v['main.f64']}; in float32 the first step's gradients agree to {v['main.first']} and rounding, "
            f"amplified by Adam, leaves the weights {v['main.drift']} apart after 10 epochs "
            f"([checking](docs/checking.md), [training](docs/training.md)).",
            f"- **Learning.** The main job (Fashion-MNIST, 10 epochs, default MLP): {v['main.hand']} test accuracy "
            f"hand-written, {v['main.twin']} twin.",
            "- **Speed** (one training step on one thread, handgrad's over the nn.Module twin's, > 1 is faster): "
            + ", ".join(f"{rows[k]['figure'].split(' (')[0].split(',')[0]} {v[k]}" for k, *_ in SPEED)
            + ".",
            "",
            f"Measured on {on(*[k for k in rows if not k.startswith(('tests.', 'learn.'))])}; each figure's command, "
            f"machine and date: [docs/figures.md](docs/figures.md).",
        ]
    )
    skips = [
        (int(v[f"tests.fast.skip.{n}"]) + int(v[f"tests.slow.skip.{n}"]), what)
        for n, what in (
            ("cuda", "a CUDA device"),
            ("graphviz", "Graphviz's `dot` (`apt-get install graphviz`, for the engine's drawn graph)"),
            ("chromium", "Chromium"),
            ("bubblewrap", "bubblewrap"),
        )
    ]
    skipped = "; ".join(f"{n} need{'s' if n == 1 else ''} {what}" for n, what in skips if n)
    install = (
        f"The environment is {v['install.venv']}, {v['install.cuda']} of it CUDA's libraries, which torch's "
        f"default build brings even where there is no NVIDIA GPU ({on('install.venv')})."
    )
    tests = (
        f"`pytest -q` runs {int(v['tests.fast.count']):,} tests and `-m slow` {int(v['tests.slow.count']):,}; "
        f"a test whose needs are missing is skipped, saying why ({skipped or 'none were, where measured'})."
    )
    return {"timings": timings, "headline": headline, "install": install, "tests": tests}


def render(text: str, rows: dict[str, dict[str, str]]) -> str:
    """``text`` (the README) with each ``<!-- figures:NAME -->`` ... ``<!-- /figures:NAME -->`` section rendered."""
    for name in SECTIONS:
        start, end = f"<!-- figures:{name} -->", f"<!-- /figures:{name} -->"
        if text.count(start) != 1 or text.count(end) != 1:
            raise SystemExit(f"README.md must hold {start} and {end} once each")
    for name, body in sections(rows).items():
        start, end = f"<!-- figures:{name} -->", f"<!-- /figures:{name} -->"
        head, rest = text.split(start)
        text = f"{head}{start}\n{body}\n{end}{rest.split(end, 1)[1]}"
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=tuple(GROUPS), help="measure these groups only")
    ap.add_argument("--render", action="store_true", help="measure nothing: write the README from the table")
    args = ap.parse_args(argv)
    rows = load() if TABLE.exists() else {}
    if not args.render:
        today = date.today().isoformat()
        for group in args.only or GROUPS:
            for key, figure, value, command, where in GROUPS[group]():
                rows[key] = {"figure": figure, "value": value, "command": command, "machine": where, "date": today}
                print(f"  {key}: {value}")
            save(rows)  # each group kept as soon as it is measured
            with contextlib.suppress(KeyError):  # and the README with it, once every group is in the table, so that
                README.write_text(render(README.read_text(), rows))  # the tests group runs on a README that agrees
    README.write_text(render(README.read_text(), rows))
    print(f"wrote {TABLE.relative_to(ROOT)} and README.md's figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
