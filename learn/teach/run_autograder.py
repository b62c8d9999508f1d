"""What an autograder zip runs on Gradescope: each exercise's submission checked, ``results/results.json`` written.

``python -m learn.teach.run_autograder NAME... [--exercises DIR]`` reads ``$AUTOGRADER_ROOT/submission``
(default ``/autograder``): ``NAME.py`` (or ``NAME.ipynb``) for each exercise, or, for a single exercise, the one
.py or .ipynb file there.  ``--exercises``: the folder of a teacher's exercises' specs (custom.py).
The configurations are drawn from the student: the e-mail addresses in ``submission_metadata.json`` when
Gradescope gives them, else the file's name (so each student's numbers are their own).  It always exits 0 once
results.json is written: Gradescope reads the score from the file.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..exercises import get
from .grade import check_one
from .gradescope import results


def root() -> Path:
    return Path(os.environ.get("AUTOGRADER_ROOT", "/autograder"))


def student(base: Path) -> str | None:
    """Who submitted: Gradescope's submission_metadata.json (its users' e-mails), or None."""
    try:
        meta = json.loads((base / "submission_metadata.json").read_text())
        users = [u.get("email") or u.get("name") or "" for u in meta.get("users", [])]
        return ",".join(sorted(u for u in users if u)) or None
    except (OSError, ValueError, AttributeError):
        return None


def find(name: str, folder: Path, alone: bool) -> tuple[Path | None, str]:
    """The submission's file for exercise ``name``, or (None, why)."""
    for suffix in (".py", ".ipynb"):
        hits = sorted(folder.rglob(f"{name}{suffix}"))
        if hits:
            return hits[0], ""
    if alone:
        files = sorted(folder.rglob("*.py")) or sorted(folder.rglob("*.ipynb"))
        if len(files) == 1:
            return files[0], ""
    return None, f"no {name}.py in the submission (submit the file python -m learn start {name} wrote, filled in)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--exercises" in argv:  # the teacher's exercises' specs, shipped in the zip
        at = argv.index("--exercises")
        from .custom import register
        register(argv[at + 1])
        del argv[at:at + 2]
    names = [get(n).name for n in argv]
    if not names:
        print("usage: python -m learn.teach.run_autograder NAME...", file=sys.stderr)
        return 2
    base = root()
    who = student(base)
    outcomes = []
    for name in names:
        path, why = find(name, base / "submission", len(names) == 1)
        key = who or (path.stem if path is not None else "anonymous")
        o = check_one(name, key, path, why)
        outcomes.append(o)
        print(o.text, end="")  # the run's log, hidden from students (stdout_visibility)
    res = results(outcomes)
    (base / "results").mkdir(parents=True, exist_ok=True)
    tmp = base / "results" / ".results.json.tmp"
    tmp.write_text(json.dumps(res, indent=1) + "\n")
    os.replace(tmp, base / "results" / "results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
