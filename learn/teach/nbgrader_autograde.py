"""nbgrader's autograde, with each check cell's outcome set from outside the student's kernel.

nbgrader scores a check cell by its outputs (an error: zero), and those outputs come from the student's own
kernel, where the answer cell ran first and can patch anything (``learn.cell.check``, ``builtins.__import__``,
IPython itself).  ``SandboxedChecks``, run right after nbgrader's Execute step, replaces the outputs of every
check cell (``learn start --nbgrader`` writes them) with the verdict of a fresh check of the notebook's own
answer cells inside bubblewrap, as ``learn grade`` checks an .ipynb: nothing the kernel did counts.  In the
course's nbgrader_config.py:

    from learn.teach.nbgrader_autograde import autograde_preprocessors
    c.Autograde.autograde_preprocessors = autograde_preprocessors()
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import nbformat
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool


def exercise_of(cell) -> str | None:
    """The exercise a check cell checks, from its metadata (``handgrad.check``, or nbgrader's ``NAME-check``
    grade id on a graded, locked, non-solution code cell), else None."""
    if cell.get("cell_type") != "code":
        return None
    meta = cell.get("metadata", {})
    mine = meta.get("handgrad")
    if isinstance(mine, dict) and isinstance(mine.get("check"), str):
        return mine["check"]
    grader = meta.get("nbgrader")
    if (
        isinstance(grader, dict)
        and grader.get("grade")
        and not grader.get("solution")
        and str(grader.get("grade_id", "")).endswith("-check")
    ):
        return str(grader["grade_id"])[: -len("-check")]
    return None


class SandboxedChecks(Preprocessor):
    """Each check cell's outputs: the report of a sandboxed check of this notebook's answer cells (an error
    output carrying it when wrong, as the cell itself would raise)."""

    enabled = Bool(True).tag(config=True)  # nbconvert's preprocessors are off unless enabled
    trust_submissions = Bool(
        False, help="where bubblewrap cannot run, check in a forked child instead of refusing (your own notebooks only)"
    ).tag(config=True)

    def preprocess(self, nb, resources):
        from ..checker.boundary import isolation

        isolate = isolation(self.trust_submissions)  # Unavailable: nbgrader reports it, nothing is scored
        with tempfile.TemporaryDirectory(prefix="handgrad-nbgrader-") as tmp:
            path = Path(tmp) / "submission.ipynb"
            nbformat.write(nb, path)
            for cell in nb.cells:
                name = exercise_of(cell)
                if name is not None:
                    cell.outputs = self._outputs(name, path, isolate)
        return nb, resources

    @staticmethod
    def _outputs(name: str, path: Path, isolate: str) -> list:
        from ..checker import check_path
        from ..checker.load import LoadError
        from ..checker.sandbox import Escaped

        try:
            report = check_path(name, path, isolate=isolate)
            text, right = report.text(), report.passed
        except (LoadError, Escaped) as e:
            text, right = f"Cannot check this notebook: {e}\n", False
        text = "(set by the sandboxed check of this notebook's answer cells, outside the kernel)\n" + text
        if right:
            return [nbformat.v4.new_output("stream", name="stdout", text=text)]
        lines = text.rstrip("\n").splitlines()
        return [nbformat.v4.new_output("error", ename="AssertionError", evalue=lines[-1], traceback=lines)]


def autograde_preprocessors() -> list:
    """nbgrader's autograde steps with SandboxedChecks right after Execute."""
    from nbgrader.converters.autograde import Autograde
    from nbgrader.preprocessors import Execute

    steps = list(Autograde.class_traits()["autograde_preprocessors"].default())
    at = steps.index(Execute) + 1 if Execute in steps else 0
    return steps[:at] + [SandboxedChecks] + steps[at:]
