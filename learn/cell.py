"""The notebook's check cell: a wrong answer raises, so the cell fails (and a grader scores it zero).

``check_class`` returns False on a wrong answer, and a notebook cell whose last value is False still runs
without error: nbgrader's autograde counts such a cell as passed.  ``check`` turns the verdict into the
cell's outcome: a right class prints the report; a wrong one raises AssertionError carrying the report.
"""
from __future__ import annotations

import contextlib
import io

from .checker import check_class


def check(name: str, cls: type) -> None:
    """Check ``cls`` as exercise ``name``; print the report when right, raise AssertionError(report) when not."""
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        right = check_class(name, cls)
    if not right:
        raise AssertionError(report.getvalue().rstrip("\n"))
    print(report.getvalue(), end="")
