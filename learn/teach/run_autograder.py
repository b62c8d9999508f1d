"""What an autograder zip runs on Gradescope: each exercise's submission checked, ``results/results.json`` written.

``python -m learn.teach.run_autograder NAME... [--exercises DIR]`` reads ``$AUTOGRADER_ROOT/submission``
(default ``/autograder``): ``NAME.py`` (or ``NAME.ipynb``) for each exercise, the one at the top before any
nested copy (the log says which it took), or, for a single exercise, the one .py or .ipynb file there.
``--exercises``: the folder of a teacher's exercises' specs (custom.py).  The configurations are drawn from the
student: the e-mail addresses in ``submission_metadata.json`` when Gradescope gives them, else the file's name.

The submission's code runs inside bubblewrap where it can (sandbox.py).  Where it cannot (Gradescope runs each
submission as root in a container where user namespaces may be off) it runs as an unprivileged user (nobody)
that cannot read the autograder's files or handgrad's installed code and cannot write results/, and every
process of that user is killed before results.json is written, so the score is the check's.  It always exits 0
once results.json is written: Gradescope reads the score from the file.

``try_zip`` (``learn autograder ... --try FILE``) runs a zip here, as Gradescope would, on a teacher's files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..exercises import get
from .grade import check_one, not_checked, seed_of
from .gradescope import results


def root() -> Path:
    return Path(os.environ.get("AUTOGRADER_ROOT", "/autograder"))


def student(base: Path) -> str | None:
    """Who submitted: Gradescope's submission_metadata.json (its users' e-mails), or None."""
    try:
        meta = json.loads((base / "submission_metadata.json").read_text())
        users = [u.get("email") or u.get("name") or "" for u in meta.get("users", [])]
        return ",".join(sorted(str(u) for u in users if u)) or None
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        return None


def find(name: str, folder: Path, alone: bool) -> tuple[Path | None, str]:
    """The submission's file for exercise ``name``: NAME.py (or NAME.ipynb) at the top, else the shallowest nested
    copy, else (a single exercise) the one .py or .ipynb file; or (None, why).  Links are never followed."""
    hits = []
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(top, d)))
        depth = len(Path(top).relative_to(folder).parts)
        hits += [
            (depth, suffix != ".py", str(Path(top) / f))
            for f in files
            for suffix in (".py", ".ipynb")
            if f == f"{name}{suffix}"
        ]
    if hits:
        return Path(min(hits)[2]), ""
    if alone:
        files = sorted(folder.rglob("*.py")) or sorted(folder.rglob("*.ipynb"))
        if len(files) == 1:
            return files[0], ""
    return None, f"no {name}.py in the submission (submit the file python -m learn start {name} wrote, filled in)"


def choose_isolation() -> tuple[str, str]:
    """("bwrap" | "user" | "fork", a note for the log): bubblewrap where it runs; as root without it, an
    unprivileged user; else (a teacher trying the zip without either) a forked child, said plainly."""
    from ..checker.boundary import bwrap_flags

    if bwrap_flags() is not None:
        return "bwrap", ""
    if os.geteuid() == 0:
        return (
            "user",
            "(bubblewrap cannot run here: each submission runs as user nobody, whose processes are all "
            "killed before the results are written)",
        )
    return (
        "fork",
        "(bubblewrap cannot run here and this is not root: the submission ran unsandboxed; on Gradescope "
        "the autograder runs as root)",
    )


def hide_from_unprivileged(base: Path) -> None:
    """Root, before running a submission as nobody: the autograder's own files and handgrad's installed code
    (the library's layers, the checker's reference engines) no longer readable by others.  A checkout on the
    path (an editable install) is left alone: there the view's stand-ins stop its import, not its reading."""
    import importlib.util

    from ..checker.boundary import PROJECT

    places = [base / "source"]
    for name in PROJECT:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin:
            origin = Path(spec.origin)
            place = origin.parent if origin.name == "__init__.py" else origin
            if {"site-packages", "dist-packages"} & set(place.parts):  # an install, never a teacher's checkout
                places.append(place)
    for place in places:
        try:
            if place.exists() and place.stat().st_uid == 0:
                os.chmod(place, 0o700 if place.is_dir() else 0o600)
        except OSError:
            pass
    results_dir = base / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(results_dir, 0o755)  # root's: nobody cannot write into it


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--exercises" in argv:  # the teacher's exercises' specs, shipped in the zip
        at = argv.index("--exercises")
        from .custom import register

        register(argv[at + 1])
        del argv[at : at + 2]
    names = [get(n).name for n in argv]
    if not names:
        print("usage: python -m learn.teach.run_autograder NAME...", file=sys.stderr)
        return 2
    base = root()
    who = student(base)
    isolate, note = choose_isolation()
    if isolate == "user":
        hide_from_unprivileged(base)
    if note:
        print(note)
    outcomes = []
    for name in names:
        path, why = find(name, base / "submission", len(names) == 1)
        key = who or (path.stem if path is not None else "anonymous")
        if path is not None:
            print(f"{name}: checking {path.relative_to(base / 'submission')}")
        try:
            o = check_one(name, key, path, why, isolate=isolate)
        except Exception as e:  # the check's own failure: the student is told, the score is 0
            o = not_checked(name, seed_of(name, key), f"not checked: the autograder failed ({type(e).__name__}: {e})")
        if path is not None:
            o.text = f"(checked {path.relative_to(base / 'submission')})\n" + o.text
        outcomes.append(o)
        print(o.text, end="")  # the run's log, hidden from students (stdout_visibility)
    if isolate == "user":
        from ..checker.boundary import kill_user, unprivileged

        kill_user(*unprivileged())  # nothing of the submission is left to touch what is written next
    res = results(outcomes)
    if note:
        res["output"] = note + "\n" + res["output"]
    (base / "results").mkdir(parents=True, exist_ok=True)
    tmp = base / "results" / ".results.json.tmp"
    tmp.write_text(json.dumps(res, indent=1) + "\n")
    os.replace(tmp, base / "results" / "results.json")
    return 0


def try_zip(zip_path: Path, files: list[Path]) -> int:
    """Run the autograder zip here as Gradescope would: unpacked into a temporary /autograder, ``files`` copied
    into its submission/, its run_autograder run with this Python (which has handgrad installed); prints the
    score and writes results.json beside the zip.  Paths are as given, from any folder."""
    zip_path = Path(zip_path).resolve()
    for f in files:
        if not Path(f).is_file():
            print(f"python -m learn autograder --try: {f} is not a file", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="handgrad-try-") as tmp:
        base = Path(tmp)
        with zipfile.ZipFile(zip_path) as z:
            z.extractall(base / "source")
        (base / "submission").mkdir()
        for f in files:
            shutil.copyfile(f, base / "submission" / Path(f).name)
        shutil.copy(base / "source" / "run_autograder", base / "run_autograder")
        env = {**os.environ, "AUTOGRADER_ROOT": str(base), "AUTOGRADER_PYTHON": sys.executable}
        run = subprocess.run(
            ["bash", str(base / "run_autograder")], env=env, cwd=base, timeout=3600, capture_output=True, text=True
        )
        got = base / "results" / "results.json"
        if run.returncode != 0 or not got.is_file():
            print(
                f"python -m learn autograder --try: run_autograder failed (exit {run.returncode}): "
                f"{(run.stderr.strip().splitlines() or ['no results.json'])[-1]}",
                file=sys.stderr,
            )
            return 2
        res = json.loads(got.read_text())
        dest = zip_path.with_name(f"{zip_path.stem}.results.json")
        shutil.copyfile(got, dest)
    total = sum(t["max_score"] for t in res["tests"])
    print(f"{', '.join(str(f) for f in files)}: {res['score']:g} of {total:g}\n{res['output']}\nresults.json: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
