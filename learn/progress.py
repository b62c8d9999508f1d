"""The learner's progress: which exercises pass, kept in ``.handgrad-progress.json`` beside the learner's files.

``learn check`` records a pass (``after_pass``); ``learn progress`` shows the course with a tick per passing
exercise and what comes next, ``--recheck`` checks the recorded files (and any NAME.py in the folder) again;
``learn list`` ticks the same ones.  The file is small JSON, written atomically (a temporary file in the same
folder, then ``os.replace``), so an interrupted write never leaves half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from .exercises import EXERCISES
from .files import check_command

STATE = ".handgrad-progress.json"


def load(folder: Path) -> dict[str, dict]:
    """{exercise: {"file": its file, "passed": when}} of ``folder``; {} when there is none or it is unreadable."""
    try:
        data = json.loads((Path(folder) / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    passed = data.get("passed") if isinstance(data, dict) else None
    return {k: v for k, v in passed.items() if isinstance(v, dict)} if isinstance(passed, dict) else {}


def save(folder: Path, passed: dict[str, dict]) -> None:
    folder = Path(folder)
    fd, tmp = tempfile.mkstemp(prefix=STATE, suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"passed": passed}, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, folder / STATE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record(name: str, file: str) -> None:
    """Note that exercise ``name`` passes with ``file``, in the state file of ``file``'s folder."""
    path = Path(file).resolve()
    passed = load(path.parent)
    passed[name] = {"file": path.name, "passed": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    with contextlib.suppress(OSError):  # a read-only folder: the pass stands, it is only not remembered
        save(path.parent, passed)


def next_steps(ex, file: str, passed: set[str]) -> str:
    """What to do after ``ex`` passed: train it, the next exercise not yet passed, or the course's closing line."""
    lines = (
        []
        if file.endswith(".ipynb")
        else [  # train reads a .py file
            f"python -m learn train {ex.name} {file}  (yours beside a trusted twin, the same weights and batches)"
        ]
    )
    todo = [e for e in EXERCISES if e.name not in passed | {ex.name}]
    after = [e for e in todo if EXERCISES.index(e) > EXERCISES.index(ex)]
    if after or todo:
        nxt = (after or todo)[0]
        lines.append(f"python -m learn start {nxt.name}  ({nxt.teaches})")
        return "Next:  " + "\n       ".join(lines) + "\n"
    return (
        "".join(f"Next:  {ln}\n" for ln in lines)
        + f"That was the last one: all {len(EXERCISES)} exercises pass.  Every backward of the course is yours; "
        f"python -m learn why NAME\nre-derives any of them, python -m learn show walks the chain rule node by "
        f"node.\n"
    )


def after_pass(ex, file: str) -> str:
    """Record the pass of ``ex`` with ``file`` and say what comes next."""
    record(ex.name, file)
    return next_steps(ex, file, set(load(Path(file).resolve().parent)))


def recheck(folder: Path) -> list[str]:
    """Check again every recorded file, and every NAME.py of the folder not recorded; keep only what passes.
    -> one line per exercise whose standing changed."""
    from .checker import check_file

    folder = Path(folder)
    passed, said = load(folder), []
    for e in EXERCISES:
        file = passed.get(e.name, {}).get("file", f"{e.name}.py")
        if not (folder / file).is_file():
            if e.name in passed:
                del passed[e.name]
                said.append(f"  {e.name}: {file} is gone; no longer counted")
            continue
        if not file.endswith(".py"):  # a notebook: its check is its last cell
            said.append(f"  {e.name}: {file} kept as it was (a notebook: run its last cell to check it again)")
            continue
        code, _ = check_file(e.name, folder / file)
        if code == 0 and e.name not in passed:
            passed[e.name] = {"file": file, "passed": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            said.append(f"  {e.name}: {file} passes")
        elif code != 0 and e.name in passed:
            del passed[e.name]
            said.append(f"  {e.name}: {file} no longer passes ({check_command(e.name, folder / file)} says why)")
    save(folder, passed)
    return said


def table(folder: Path, verbose: bool = True) -> str:
    """The course in order, a tick for each passing exercise, and what comes next."""
    passed = load(folder)
    lines = []
    for k, e in enumerate(EXERCISES, 1):
        tick = "[x]" if e.name in passed else "[ ]"
        lines.append(f"  {tick} {k:2d}. {e.name:<22} {e.teaches}")
    done = sum(e.name in passed for e in EXERCISES)
    lines.append(f"\n{done} of {len(EXERCISES)} pass.")
    if verbose:
        todo = [e for e in EXERCISES if e.name not in passed]
        if todo:
            lines.append(
                f"Next:  python -m learn start {todo[0].name}  (then {check_command(todo[0].name)}; "
                f"stuck: python -m learn hint {todo[0].name}, python -m learn why {todo[0].name})"
            )
        else:
            lines.append("The course is done: every exercise passes.")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    folder = Path(args.dir)
    if not folder.is_dir():
        print(f"python -m learn progress: {folder} is not a folder")
        return 2
    if args.recheck:
        said = recheck(folder)
        print("Checked again:\n" + ("\n".join(said) if said else "  nothing changed") + "\n")
    kept = folder / STATE
    print(f"Your progress ({kept if kept.exists() else f'nothing passed yet in {folder}'}):\n")
    print(table(folder), end="")
    return 0
