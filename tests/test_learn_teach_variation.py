"""Per-student variation keeps the checker's promises: on a student's own configurations (drawn from a seed made
from the exercise and the student's name) every worked solution still passes, and a catalogued wrong answer of
each exercise still fails with its mistake named."""

import pytest

from learn.checker import check_path
from learn.exercises import EXERCISES
from learn.source import solution_text
from learn.teach.grade import seed_of
from tests.test_learn_mistakes import WRONG, learner_file


@pytest.mark.parametrize("ex", EXERCISES, ids=[e.name for e in EXERCISES])
def test_a_right_answer_passes_on_a_students_configurations(tmp_path, ex):
    path = tmp_path / f"{ex.name}.py"
    path.write_text(solution_text(ex, str(path)))
    report = check_path(ex.name, path, seed_of(ex.name, "alice"))
    assert report.passed and all(i.passed for i in report.items.values()), report.text()


FIRST_OF_EACH = list({name: (name, changes, key) for name, changes, key in reversed(WRONG)}.values())


@pytest.mark.parametrize("name, changes, key", FIRST_OF_EACH, ids=[key for _, _, key in FIRST_OF_EACH])
def test_a_catalogued_mistake_is_named_on_a_students_configurations(tmp_path, name, changes, key):
    """The first catalogued wrong answer of each exercise (the whole catalogue is test_learn_mistakes.py's)."""
    report = check_path(name, learner_file(tmp_path, name, changes), seed_of(name, "bob"))
    assert not report.passed and key in report.named, report.text()
