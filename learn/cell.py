"""The notebook's check cell: a wrong answer raises, so the cell fails (and a grader scores it zero).

``check_class`` returns False on a wrong answer, and a notebook cell whose last value is False still runs
without error: nbgrader's autograde counts such a cell as passed.  ``check`` turns the verdict into the
cell's outcome: a right class prints the report; a wrong one raises AssertionError carrying the report.

``check(name, notebook="linear.ipynb")`` (nbgrader's check cell) does not trust the kernel it runs in: it checks
the notebook's own answer cells as saved on disk, in a fresh process inside bubblewrap where it can run, as
``learn grade`` checks an .ipynb, so a class imported or a checker patched in the kernel changes nothing.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from .checker import check_class


def check(name: str, cls: type | None = None, notebook: str | None = None) -> None:
    """Check exercise ``name``: the notebook file ``notebook`` (found beside the kernel, else by its nbgrader
    answer cell's id) when given, else the class ``cls``; print the report when right, raise AssertionError(report)
    when not."""
    path = _find(name, notebook) if notebook is not None else None
    if path is not None:
        return _check_saved(name, path)
    if cls is None:
        raise AssertionError(f"no {notebook} here to check, and no class given")
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        right = check_class(name, cls)
    if not right:
        raise AssertionError(report.getvalue().rstrip("\n"))
    print(report.getvalue(), end="")


def _find(name: str, notebook: str) -> Path | None:
    """``notebook`` in the kernel's folder, else the one notebook there whose answer cell is nbgrader's
    ``NAME-answer`` (a renamed copy), else None."""
    path = Path(notebook)
    if path.is_file():
        return path
    hits = []
    for candidate in sorted(Path(".").glob("*.ipynb"))[:50]:
        try:
            cells = json.loads(candidate.read_text(encoding="utf-8")).get("cells", [])
            ids = {(c.get("metadata", {}).get("nbgrader") or {}).get("grade_id") for c in cells if isinstance(c, dict)}
        except (OSError, ValueError, AttributeError, TypeError, RecursionError):
            continue
        if f"{name}-answer" in ids:
            hits.append(candidate)
    return hits[0] if len(hits) == 1 else None


def _check_saved(name: str, path: Path) -> None:
    from .checker import check_path
    from .checker.boundary import isolation
    from .checker.load import LoadError
    from .checker.sandbox import Escaped, Unavailable

    isolate = isolation(trusted=True)
    where = (
        "in a fresh process inside bubblewrap"
        if isolate == "bwrap"
        else "in a fresh forked process (bubblewrap is not installed here: not a sandbox)"
    )
    note = f"(checked: the code cells of {path} as saved on disk, {where}; save the notebook before this cell)\n"
    try:
        report = check_path(name, path, isolate=isolate)
    except LoadError as e:
        raise AssertionError(f"{note}Cannot check {path}: {e}") from None
    except (Escaped, Unavailable) as e:
        raise AssertionError(f"{note}Stopped checking {path}: {e}") from None
    if not report.passed:
        raise AssertionError(note + report.text().rstrip("\n"))
    print(note + report.text(), end="")
