"""The teacher's mode: a check as a grader's results (Gradescope, JSON), a class graded from a folder, an
autograder zip, nbgrader notebooks, and a teacher's own exercises."""
from .gradescope import Outcome, outcome, plain, results, tests

__all__ = ["Outcome", "outcome", "plain", "results", "tests"]
