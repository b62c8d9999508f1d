"""The teacher's mode: a check as a grader's results (Gradescope, JSON), a class graded from a folder, an
autograder zip, nbgrader notebooks, and a teacher's own exercises (docs/learn.md, For teachers)."""

from .autograder import make_zip
from .custom import ExerciseError, register, unregister
from .grade import grade
from .gradescope import Outcome, outcome, plain, results, tests
from .nbgrader import nbgrader_notebook

__all__ = [
    "ExerciseError",
    "Outcome",
    "grade",
    "make_zip",
    "nbgrader_notebook",
    "outcome",
    "plain",
    "register",
    "results",
    "tests",
    "unregister",
]
