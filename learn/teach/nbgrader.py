"""``python -m learn start NAME --notebook --nbgrader``: the exercise as nbgrader's source notebook.

The code cell holds the worked solution between nbgrader's own ``### BEGIN SOLUTION`` / ``### END SOLUTION``
markers (``nbgrader generate_assignment`` cuts them into the students' version, as ``learn start`` does), marked
as a solution cell; the last cell, which raises on a wrong answer (learn/cell.py), is a locked autograded test
cell worth ``points``; the text above it is locked.  The check cell does not trust the kernel: it checks the
notebook's own answer cells as saved, in a fresh sandboxed process (``check(NAME, notebook=FILE)``), and
``nbgrader_autograde.SandboxedChecks``, added to the course's nbgrader_config.py, sets its outcome from outside
the kernel altogether.  The cells' metadata follow nbgrader's schema 3:
https://nbgrader.readthedocs.io/en/stable/contributor_guide/metadata.html
"""

from __future__ import annotations

from pathlib import Path

from ..exercises import Exercise
from ..source import _register, check_block, notebook

SCHEMA = 3


def marked_text(ex: Exercise, file: str) -> str:
    """The exercise's source with its answer regions still marked (nbgrader's markers are the same)."""
    return ex.source.read_text().replace("{check}", check_block(ex, file)).rstrip("\n") + "\n"


def cell_metadata(grade_id: str, *, grade: bool, solution: bool, locked: bool, points: float | None = None) -> dict:
    meta = {"grade": grade, "solution": solution, "locked": locked, "grade_id": grade_id, "schema_version": SCHEMA}
    if grade:
        meta["points"] = points
    return meta


def nbgrader_notebook(ex: Exercise, file: str, points: float = 1):
    """The nbgrader source notebook of ``ex``: intro (locked), solution (marked), check (graded, ``points``)."""
    nb = notebook(ex, marked_text(ex, file))
    intro, answer, check = nb.cells
    check.source = (
        f"{_register(ex)}from learn.cell import check\n\n"
        f"# this notebook's answer cells as saved (save it first), checked in a fresh sandboxed process:\n"
        f"# nothing defined or changed in this kernel counts\n"
        f"check({ex.name!r}, notebook={Path(file).with_suffix('.ipynb').name!r})"
    )
    intro.metadata["nbgrader"] = cell_metadata(f"{ex.name}-intro", grade=False, solution=False, locked=True)
    answer.metadata["nbgrader"] = cell_metadata(f"{ex.name}-answer", grade=False, solution=True, locked=False)
    check.metadata["nbgrader"] = cell_metadata(
        f"{ex.name}-check", grade=True, solution=False, locked=True, points=points
    )
    return nb
