"""Grading a class: every submission of one exercise checked, a grade each, and what the class got wrong.

``grade(name, folder, out)``: the submissions are ``alice.py`` (or ``alice.ipynb``) files or ``alice/``
folders holding ``NAME.py`` or ``NAME.ipynb`` (the shallowest, or the one .py or .ipynb file at the folder's
top); the student is the file's or folder's name.  Each is checked inside bubblewrap (sandbox.py: its own PID,
network and file-system view, none of the other submissions, the worked solutions or ``out``; the sandbox's time
and memory limits), so a hang, a crash, a syntax error or an attack is graded 0 with one line and never stops the
class; on configurations drawn from a seed made from the exercise and the student's name
(``configs.stable_seed``), so an answer that hard-codes one run's numbers fails another's.  Written to ``out``,
a folder outside the submissions, and nowhere else:

    grades.csv                      student, score, max_score, verdict, named_mistakes, seed, note: every
                                    student, one not reached saying why
    students/STUDENT/results.json   Gradescope's form (gradescope.py), the seed in extra_data
    summary.txt, summary.png        how many students made each named mistake, ranked; and where the
                                    class's answers first went wrong, item by item

Names are written escaped (``wire.one_line``): a file named with a newline or a terminal escape cannot forge
a line of the summary or a folder of ``out``.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections import Counter
from pathlib import Path

from ..checker.configs import stable_seed
from ..checker.report import Item
from ..checker.wire import one_line
from ..exercises import get
from .gradescope import Outcome, outcome, results

NO_NAME = "(wrong, no known mistake named)"
NOT_CHECKED = "(not checked: a hang, a crash, no class, not Python)"


class GradeError(ValueError):
    """The grading cannot start (the --out folder, the submissions folder): one line."""


def _candidates(folder: Path, name: str) -> list[Path]:
    """NAME.py or NAME.ipynb anywhere under ``folder`` (links not followed), the shallowest first; else the one
    .py or .ipynb file at its top."""
    hits = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not os.path.islink(os.path.join(root, d)))
        depth = len(Path(root).relative_to(folder).parts)
        hits += [
            (depth, suffix != ".py", Path(root) / f)
            for f in files
            for suffix in (".py", ".ipynb")
            if f == f"{name}{suffix}"
        ]
    if hits:
        return [p for *_, p in sorted(hits)]
    top = sorted(p for p in folder.iterdir() if p.suffix == ".py" and p.is_file()) or sorted(
        p for p in folder.iterdir() if p.suffix == ".ipynb" and p.is_file()
    )
    return top if len(top) == 1 else []


def submissions(name: str, folder: Path) -> list[tuple[str, Path | None, str]]:
    """(student, the file to check or None, why there is none) for each submission in ``folder``, by name: a
    student with two submissions, a link or a folder without the file is one of them too, with its reason."""
    ex = get(name)
    found: dict[str, list] = {}
    for entry in sorted(Path(folder).iterdir()):
        if entry.name.startswith((".", "_")):
            continue
        student = entry.stem if entry.suffix in (".py", ".ipynb") and not entry.is_dir() else entry.name
        if entry.is_symlink():
            found.setdefault(student, []).append((None, f"{one_line(entry.name)} is a link: submit the file itself"))
        elif entry.is_dir():
            files = _candidates(entry, ex.name)
            found.setdefault(student, []).append(
                (files[0], "")
                if files
                else (None, f"{one_line(entry.name)}/ holds no {ex.name}.py or {ex.name}.ipynb (nor one .py file)")
            )
        elif entry.suffix in (".py", ".ipynb") and entry.is_file():
            found.setdefault(student, []).append((entry, ""))
    out = []
    for student, entries in found.items():
        if len(entries) > 1:
            out.append(
                (student, None, f"two submissions ({', '.join(one_line(str(p or '?')) for p, _ in entries)}): keep one")
            )
        else:
            out.append((student, *entries[0]))
    return out


def seed_of(name: str, student: str) -> int:
    return stable_seed(f"{name}:{student}")


def check_one(
    name: str, student: str, path: Path | None, why: str, *, isolate: str = "bwrap", time_limit: float | None = None
) -> Outcome:
    """One student's outcome; never raises for anything the submission does (an Unavailable sandbox aside)."""
    seed = seed_of(name, student)
    if path is None:
        return not_checked(name, seed, f"Cannot check {one_line(student)}'s submission: {why}")
    return outcome(name, path, seed, isolate=isolate, time_limit=time_limit)


def not_checked(name: str, seed: int | None, line: str) -> Outcome:
    from ..checker import planned
    from ..checker.configs import variant

    with variant(seed):
        items = [Item(n) for n in planned(name)]
    return Outcome(name, 2, line.rstrip("\n") + "\n", items, seed=seed)


def first_line(o: Outcome) -> str:
    """The one line of a submission that could not be checked."""
    return one_line(" ".join(o.text.split()))[:300] if o.status == 2 else ""


def check_out(folder: Path, out: Path) -> Path:
    """``out`` as a folder to write into, outside the submissions; GradeError in one line otherwise."""
    folder, out = Path(folder).resolve(), Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise GradeError(f"--out {out} is a file: give a folder (it is made if need be)")
    if out == folder or folder in out.parents:
        raise GradeError(f"--out {out} is inside the submissions ({folder}): give a folder outside them")
    return out


def grade(
    name: str, folder: Path, out: Path, say=print, *, isolate: str = "bwrap", time_limit: float | None = None
) -> list[tuple[str, Outcome]]:
    """Check every submission in ``folder``; write the grades, each student's results.json and the summary into
    ``out``.  Every student gets a row: one whose check failed for a reason of the grader's, or was not reached
    (Ctrl-C), says so; a KeyboardInterrupt is raised again once the grades are written."""
    from training.storage.files import atomic_write_text

    ex = get(name)
    out = check_out(folder, out)
    (out / "students").mkdir(parents=True, exist_ok=True)
    graded, todo = [], submissions(ex.name, folder)
    stopped = None
    for _k, (student, path, why) in enumerate(todo):
        if stopped is not None:
            graded.append((student, not_checked(ex.name, seed_of(ex.name, student), f"not reached: {stopped}")))
            continue
        try:
            o = check_one(ex.name, student, path, why, isolate=isolate, time_limit=time_limit)
        except KeyboardInterrupt:
            stopped = "the grading was interrupted (Ctrl-C) before this submission"
            graded.append((student, not_checked(ex.name, seed_of(ex.name, student), f"not reached: {stopped}")))
            continue
        except Exception as e:  # the checker's own failure on this submission: the class goes on
            o = not_checked(
                ex.name,
                seed_of(ex.name, student),
                f"not checked: the checker failed on this submission ({type(e).__name__}: {e})",
            )
        graded.append((student, o))
        res = results([o])
        res["extra_data"]["student"] = one_line(student)
        (out / "students" / folder_name(student)).mkdir(exist_ok=True)
        atomic_write_text(out / "students" / folder_name(student) / "results.json", json.dumps(res, indent=1) + "\n")
        score = sum(t["score"] for t in res["tests"])
        say(
            f"{one_line(student)}: {o.verdict}, {score:g} of {len(res['tests'])}"
            + (f" ({', '.join(o.named)})" if o.named else "")
            + (f": {first_line(o)}" if o.status == 2 else "")
        )
    atomic_write_text(out / "grades.csv", grades_csv(graded))
    atomic_write_text(out / "summary.txt", summary_text(ex.name, graded))
    try:
        chart(ex.name, graded, out / "summary.png")
    except Exception as e:  # a figure is not worth the grades: they are written already
        say(f"(summary.png not drawn: {type(e).__name__}: {one_line(str(e))[:200]})")
    if stopped is not None:
        raise KeyboardInterrupt
    return graded


def folder_name(student: str) -> str:
    """The student's folder under students/: the name escaped, never empty, never a path."""
    safe = one_line(student.replace("\\", "\\\\")).replace("/", "_")  # escaped both ways: one folder a name
    return safe if safe not in ("", ".", "..") else f"_{safe}_"


def grades_csv(graded: list[tuple[str, Outcome]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["student", "score", "max_score", "verdict", "named_mistakes", "seed", "note"])
    for student, o in graded:
        score = 0 if o.status == 2 else sum(i.passed is True for i in o.items)
        w.writerow([one_line(student), score, len(o.items), o.verdict, " ".join(o.named), o.seed, first_line(o)])
    return buf.getvalue()


def mistake_counts(graded: list[tuple[str, Outcome]]) -> list[tuple[str, int]]:
    """(mistake, how many students made it), most made first; a wrong answer with no name, and a submission that
    could not be checked, counted under their own labels."""
    counts: Counter = Counter()
    for _, o in graded:
        if o.status == 2:
            counts[NOT_CHECKED] += 1
        elif o.status == 1:
            counts.update(dict.fromkeys(o.named or [NO_NAME], 1))
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _formulas(name: str) -> dict[str, str]:
    from ..checker.specs import catalogue

    return {m.key: m.formula for where, m in catalogue() if where in (name, "any layer")}


def summary_text(name: str, graded: list[tuple[str, Outcome]]) -> str:
    verdicts = Counter(o.verdict for _, o in graded)
    lines = [
        f"{name}: {len(graded)} submissions: {verdicts['right']} right, {verdicts['wrong']} wrong, "
        f"{verdicts['not checked']} not checked",
        "",
        "The mistakes named, by how many students made each:",
        "",
    ]
    formulas = _formulas(name)
    counts = mistake_counts(graded)
    width = max([len(k) for k, _ in counts] + [7])
    lines.append(f"  {'students':>8}  {'mistake':<{width}}  what they wrote")
    for key, n in counts:
        lines.append(f"  {n:>8}  {key:<{width}}  {formulas.get(key, '')}".rstrip())
    if not counts:
        lines.append("  (none: every submission is right)")
    first: Counter = Counter()  # where each wrong answer first went wrong
    for _, o in graded:
        if o.status == 1:
            first.update([next((i.name for i in o.items if i.passed is False), "?")])
    if first:
        lines += ["", "Where the wrong answers first went wrong, by item:", ""]
        lines += [f"  {n:>8}  {item}" for item, n in sorted(first.items(), key=lambda kv: (-kv[1], kv[0]))]
    return "\n".join(lines) + "\n"


def chart(name: str, graded: list[tuple[str, Outcome]], path: Path) -> None:
    """The mistakes' counts as a horizontal bar chart, most made on top, written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from training.storage.files import atomic_write

    counts = mistake_counts(graded)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * max(len(counts), 1)))
    labels = [k for k, _ in counts][::-1] or ["(no mistakes)"]
    colors = ["#999999" if k.startswith("(") else "#c0504d" for k in labels]  # grey: not a named mistake
    ax.barh(range(len(labels)), [n for _, n in counts][::-1] or [0], color=colors)
    ax.set_yticks(range(len(labels)), [one_line(k) for k in labels])
    ax.set_xlabel("students")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(f"{one_line(name)}: the mistakes of {len(graded)} submissions")
    for text in [ax.title, *ax.get_yticklabels()]:
        text.set_parse_math(False)  # a $ in a name is a dollar, not mathtext
    fig.tight_layout()
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    finally:
        plt.close(fig)
