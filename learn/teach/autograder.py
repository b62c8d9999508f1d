"""``python -m learn autograder NAME... --out autograder.zip``: a Gradescope autograder for these exercises.

The zip holds, at its root, what Gradescope's spec asks for: ``setup.sh`` (run once when the image is built; it
installs torch from the package index unless the image has it, then this project from the wheel inside the zip,
offline: ``--no-index --no-deps``) and ``run_autograder`` (run per submission: it checks
``/autograder/submission/`` and writes ``/autograder/results/results.json``, run_autograder.py).  Both honour
``AUTOGRADER_ROOT`` (default ``/autograder``) and ``AUTOGRADER_PYTHON`` (default ``python3``), so the zip can be
tried on this machine by unpacking it into a folder of its own.

The wheel is built from this checkout with ``pip wheel --no-deps --no-build-isolation`` (no network: setuptools
comes from this environment) in a temporary copy of the sources, so no build/ or egg-info is left here.  In that
copy each exercise's file is its stub (``learn start``'s): the zip holds no worked solution.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..exercises import EXERCISES, get
from ..source import stub_text
from .custom import SPEC_SUFFIX, is_custom

ROOT = Path(__file__).resolve().parents[2]  # the checkout: pyproject.toml beside learn/

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, from the unpacked zip (/autograder/source), when it builds the image.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${AUTOGRADER_PYTHON:-python3}"
if ! "$PY" -c "import torch" 2>/dev/null; then  # the one dependency: CPU torch from PyTorch's index
    "$PY" -m pip install torch --index-url https://download.pytorch.org/whl/cpu
fi
"$PY" -m pip install --no-index --no-deps "$HERE"/WHEEL
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: it reads $ROOT/submission and writes $ROOT/results/results.json.
set -uo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
export AUTOGRADER_ROOT="$ROOT"
mkdir -p "$ROOT/results"
exec "${AUTOGRADER_PYTHON:-python3}" -m learn.teach.run_autograder NAMES
"""


def build_wheel(dest: Path) -> Path:
    """This project's wheel, built offline into ``dest``."""
    if not (ROOT / "pyproject.toml").is_file():
        raise RuntimeError(f"no pyproject.toml in {ROOT}: the autograder is built from a handgrad checkout")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise RuntimeError("building the autograder reads pyproject.toml with tomllib: Python 3.11 or later") from None
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tool = config["tool"]["setuptools"]
    with tempfile.TemporaryDirectory(prefix="handgrad-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for f in ("pyproject.toml", "README.md", "LICENSE", *(f"{m}.py" for m in tool.get("py-modules", []))):
            if (ROOT / f).is_file():
                shutil.copy2(ROOT / f, src / f)
        packages = tool["packages"]  # a list of names, or setuptools' find: {include: ["layers*", ...]}
        names = packages["find"]["include"] if isinstance(packages, dict) else packages
        for top in sorted({p.split(".")[0].rstrip("*") for p in names}):
            if (ROOT / top).is_dir():
                shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for ex in EXERCISES:  # the answers cut out: a student who reads the zip finds the stubs only
            if not is_custom(ex.name) and ex.source.is_file():
                (src / "learn" / "exercises" / ex.source.name).write_text(stub_text(ex, f"{ex.name}.py"))
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "-q",
                "-w",
                str(dest),
                str(src),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if run.returncode != 0:
            raise RuntimeError("pip wheel failed: " + (run.stderr.strip().splitlines() or ["?"])[-1])
    wheels = sorted(dest.glob("handgrad-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip wheel wrote no handgrad wheel into {dest}")
    return wheels[-1]


def make_zip(names: list[str], out: Path) -> Path:
    """The autograder zip for exercises ``names``, written to ``out`` (atomically).  A teacher's exercise
    (custom.py) travels as its spec file, in ``exercises/``, which run_autograder registers."""
    names = [get(n).name for n in names]
    specs = [get(n).folder / f"{n}{SPEC_SUFFIX}" for n in names if is_custom(n)]
    args = " ".join(names) + (' --exercises "$ROOT/source/exercises"' if specs else "")
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="handgrad-autograder-") as tmp:
        wheel = build_wheel(Path(tmp))
        part = out.with_name(f".{out.name}.part")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            for arcname, text in (
                ("setup.sh", SETUP_SH.replace("WHEEL", wheel.name)),
                ("run_autograder", RUN_AUTOGRADER.replace("NAMES", args)),
            ):
                info = zipfile.ZipInfo(arcname)
                info.external_attr = 0o100755 << 16  # executable: Gradescope runs them as they are
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, text)
            z.write(wheel, wheel.name)
            for spec in specs:
                z.write(spec, f"exercises/{spec.name}")
        part.replace(out)
    return out
