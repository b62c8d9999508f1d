"""Grading a class: every submission of one exercise checked, a grade each, and what the class got wrong.

``grade(name, folder, out)``: the submissions are ``alice.py`` (or ``alice.ipynb``) files or ``alice/``
folders holding ``NAME.py`` (or the one .py file there); the student is the file's or folder's name.  Each is
checked as ``learn check`` checks (its code in a bounded child process: the sandbox's time and memory limits;
a hang, a crash or a syntax error is graded 0 with one line), on configurations drawn from a seed made from the
exercise and the student's name (``configs.stable_seed``), so an answer that hard-codes one run's numbers fails
another's.  Written to ``out``:

    grades.csv                      student, score, max_score, verdict, named_mistakes, seed, note
    students/STUDENT/results.json   Gradescope's form (gradescope.py), the seed in extra_data
    summary.txt, summary.png        how many students made each named mistake, ranked; and where the
                                    class's answers first went wrong, item by item
"""
from __future__ import annotations

import csv
import io
import json
import tempfile
from collections import Counter
from pathlib import Path

from ..checker.configs import stable_seed
from ..exercises import get
from ..files import NotebookError, notebook_code
from .gradescope import Outcome, outcome, results

NO_NAME = "(wrong, no known mistake named)"
NOT_CHECKED = "(not checked: a hang, a crash, no class, not Python)"


def submissions(name: str, folder: Path) -> list[tuple[str, Path | None, str]]:
    """(student, the file to check or None, why there is none) for each submission in ``folder``, by name."""
    ex = get(name)
    found = []
    for entry in sorted(Path(folder).iterdir()):
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_dir():
            files = [entry / f"{ex.name}.py"] if (entry / f"{ex.name}.py").is_file() else \
                sorted(entry.glob("*.py")) or sorted(entry.glob("*.ipynb"))
            if len(files) == 1:
                found.append((entry.name, files[0], ""))
            else:
                found.append((entry.name, None, f"{entry}/ holds {len(files) or 'no'} .py files; expected "
                                                f"{ex.name}.py"))
        elif entry.suffix in (".py", ".ipynb"):
            found.append((entry.stem, entry, ""))
    seen: dict[str, Path | None] = {}
    for student, path, _ in found:
        if student in seen:
            raise ValueError(f"two submissions for {student} in {folder}: {seen[student]} and {path}; keep one")
        seen[student] = path
    return found


def seed_of(name: str, student: str) -> int:
    return stable_seed(f"{name}:{student}")


def check_one(name: str, student: str, path: Path | None, why: str) -> Outcome:
    seed = seed_of(name, student)
    if path is None:
        o = outcome(name, Path(f"/nonexistent/{student}/{name}.py"), seed)
        o.text = f"Cannot check {student}'s submission: {why}\n"
        return o
    if path.suffix != ".ipynb":
        return outcome(name, path, seed)
    with tempfile.TemporaryDirectory(prefix="handgrad-grade-") as tmp:
        copy = Path(tmp) / f"{path.stem}.py"
        try:
            copy.write_text(notebook_code(path))
        except NotebookError as e:
            copy.write_text(f"raise SyntaxError({str(e)!r})\n")
        o = outcome(name, copy, seed)
    o.text = o.text.replace(str(copy), str(path))
    return o


def first_line(o: Outcome) -> str:
    """The one line of a submission that could not be checked."""
    return " ".join(o.text.split())[:300] if o.status == 2 else ""


def grade(name: str, folder: Path, out: Path, say=print) -> list[tuple[str, Outcome]]:
    """Check every submission in ``folder``; write the grades, each student's results.json and the summary."""
    from training.storage.files import atomic_write_text
    ex = get(name)
    out = Path(out)
    (out / "students").mkdir(parents=True, exist_ok=True)
    graded = []
    for student, path, why in submissions(ex.name, folder):
        o = check_one(ex.name, student, path, why)
        res = results([o])
        res["extra_data"]["student"] = student
        (out / "students" / student).mkdir(exist_ok=True)
        atomic_write_text(out / "students" / student / "results.json", json.dumps(res, indent=1) + "\n")
        graded.append((student, o))
        score = sum(t["score"] for t in res["tests"])
        say(f"{student}: {o.verdict}, {score:g} of {len(res['tests'])}" + (f" ({', '.join(o.named)})" if o.named
                                                                             else "")
            + (f": {first_line(o)}" if o.status == 2 else ""))
    atomic_write_text(out / "grades.csv", grades_csv(graded))
    atomic_write_text(out / "summary.txt", summary_text(ex.name, graded))
    chart(ex.name, graded, out / "summary.png")
    return graded


def grades_csv(graded: list[tuple[str, Outcome]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["student", "score", "max_score", "verdict", "named_mistakes", "seed", "note"])
    for student, o in graded:
        score = 0 if o.status == 2 else sum(i.passed is True for i in o.items)
        w.writerow([student, score, len(o.items), o.verdict, " ".join(o.named), o.seed, first_line(o)])
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
    lines = [f"{name}: {len(graded)} submissions: {verdicts['right']} right, {verdicts['wrong']} wrong, "
             f"{verdicts['not checked']} not checked", "", "The mistakes named, by how many students made each:", ""]
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
    labels = [k for k, _ in counts][::-1]
    colors = ["#999999" if k.startswith("(") else "#c0504d" for k in labels]  # grey: not a named mistake
    ax.barh(labels or ["(no mistakes)"], [n for _, n in counts][::-1] or [0], color=colors or None)
    ax.set_xlabel("students")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(f"{name}: the mistakes of {len(graded)} submissions")
    fig.tight_layout()
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    finally:
        plt.close(fig)
