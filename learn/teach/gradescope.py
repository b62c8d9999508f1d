"""A check as a grader's results: Gradescope's ``results.json`` (one test per checked item) and a plain JSON form.

Each item of the checker's Report (the forward, each gradient, accumulation, inputs unchanged, central
differences, each further configuration; see ``learn.checker.planned``) is a test worth one point.  The first
failed test carries the whole report (the table of tensors, the mistake named) and, as ``tags``, the keys of the
mistakes named there; a test the check never reached, because an earlier one failed, fails with a line that says
so.  A file that cannot be checked (not Python, no class, an endless loop, an exit) fails every test, the first
with the one line that says why.  The format: https://gradescope-autograders.readthedocs.io/en/latest/specs/
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..checker import check_path, planned
from ..checker.configs import variant
from ..checker.load import LoadError
from ..checker.report import Item
from ..checker.sandbox import Escaped


@dataclass
class Outcome:
    """One file's check, structured: the exit status of ``learn check`` (0 right, 1 wrong, 2 not checkable)."""

    exercise: str
    status: int
    text: str  # the report as ``learn check`` prints it, or the one line of an unusable file
    items: list[Item]
    named: list[str] = field(default_factory=list)
    seed: int | None = None

    @property
    def verdict(self) -> str:
        return ("right", "wrong", "not checked")[self.status]


def outcome(
    name: str, path: Path, seed: int | None = None, *, isolate: str = "fork", time_limit: float | None = None
) -> Outcome:
    """Check ``path`` as exercise ``name`` (configurations drawn from ``seed``, its code run as ``isolate`` says:
    sandbox.Sandbox) and keep every item's result.  Unavailable (the check's process could not start) is
    raised: it is the grader's failure, not the submission's."""
    try:
        report = check_path(name, path, seed, isolate=isolate, time_limit=time_limit)
    except (LoadError, Escaped) as e:
        what = "Cannot check" if isinstance(e, LoadError) else "Stopped checking"
        with variant(seed):
            items = [Item(n) for n in planned(name)]
        return Outcome(name, 2, f"{what} {path}: {e}\n", items, seed=seed)
    return Outcome(name, 0 if report.passed else 1, report.text(), list(report.items.values()), report.named, seed)


def tests(o: Outcome, prefix: str = "") -> list[dict]:
    """Gradescope's tests, one per item, each worth one point."""
    failed = next((i for i in o.items if i.passed is False), None)
    first = failed or next((i for i in o.items if i.passed is None), None)
    if o.status != 0 and first is None:  # wrong, yet every item passed: the verdict must still cost a point
        o.items = [*o.items, Item("the rest of the check", False, list(o.named))]
        first = o.items[-1]
    out = []
    for i in o.items:
        ok = i.passed is True and o.status != 2
        if ok:
            text = "right"
        elif i is first:
            text = o.text
        else:
            text = f'not checked: "{first.name}" failed first; fix that and this is checked next'
        out.append(
            {
                "name": prefix + i.name,
                "score": 1.0 if ok else 0.0,
                "max_score": 1.0,
                "status": "passed" if ok else "failed",
                "output": text,
                "output_format": "text",
                "visibility": "visible",
                "tags": list(i.named) if i is first and o.status == 1 else [],
                "extra_data": {
                    "exercise": o.exercise,
                    "item": i.name,
                    "seed": o.seed,
                    "checked": i.passed is not None and o.status != 2,
                },
            }
        )
    return out


def results(outcomes: list[Outcome]) -> dict:
    """Gradescope's results.json for one or more exercises' outcomes (the tests prefixed by the exercise when
    there are several)."""
    many = len(outcomes) > 1
    all_tests = [t for o in outcomes for t in tests(o, f"{o.exercise}: " if many else "")]
    lines = [
        f"{o.exercise}: {o.verdict.upper()}" + (f" (the mistakes named: {', '.join(o.named)})" if o.named else "")
        for o in outcomes
    ]
    return {
        "score": sum(t["score"] for t in all_tests),
        "output": "\n".join(lines),
        "output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": all_tests,
        "extra_data": {
            "exercises": [o.exercise for o in outcomes],
            "seeds": [o.seed for o in outcomes],
            "verdicts": [o.verdict for o in outcomes],
            "named": [o.named for o in outcomes],
        },
    }


def plain(o: Outcome) -> dict:
    """The check as plain JSON: the verdict, each item, the named mistakes and the report's text."""
    return {
        "exercise": o.exercise,
        "verdict": o.verdict,
        "exit_status": o.status,
        "seed": o.seed,
        "named": o.named,
        "items": [{"name": i.name, "passed": i.passed, "named": i.named} for i in o.items],
        "score": sum(i.passed is True for i in o.items) if o.status != 2 else 0,
        "max_score": len(o.items),
        "report": o.text,
    }
