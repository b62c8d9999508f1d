"""A teacher's own exercise (docs/learn.md's Swish, read from the page itself) is started, checked, hinted,
explained and graded as the built-in ones are: a right answer passes on every configuration, each known mistake
written as a learner would is named, the stub is cut from the solution, grade and Gradescope's form work on it;
a spec that cannot be used is refused with one line."""

import json
import re
from pathlib import Path

import pytest

from learn.__main__ import main
from learn.teach.custom import unregister

ROOT = Path(__file__).resolve().parents[1]


def _docs_files() -> dict[str, str]:
    text = (ROOT / "docs" / "learn.md").read_text()
    return dict(re.findall(r"^`(swish(?:_spec)?\.py)`:\n\n```python\n(.*?)```", text, re.S | re.M))


@pytest.fixture
def folder(tmp_path):
    files = _docs_files()
    assert set(files) == {"swish.py", "swish_spec.py"}
    d = tmp_path / "my_exercises"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    yield d
    unregister()  # the registries are the process's: leave them as the other tests expect


def _solution(tmp_path, folder, capsys):
    path = tmp_path / "swish.py"
    assert main(["start", "swish", "--solution", "--out", str(path), "--exercises", str(folder)]) == 0
    capsys.readouterr()
    return path


def test_start_check_hint_and_why(tmp_path, folder, capsys):
    stub = tmp_path / "stub.py"
    assert main(["--exercises", str(folder), "start", "swish", "--out", str(stub)]) == 0
    assert "### BEGIN" not in stub.read_text() and "raise NotImplementedError" in stub.read_text()
    assert f"--exercises {folder}" in stub.read_text()  # the stub says how to check it
    capsys.readouterr()
    assert main(["check", "swish", str(stub), "--exercises", str(folder)]) == 1
    path = _solution(tmp_path, folder, capsys)
    assert main(["check", "swish", str(path), "--exercises", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "on 3 configurations" in out and "one example (the first dimension 1)" in out and "PASS" in out
    assert main(["hint", "swish", "--level", "2", "--exercises", str(folder)]) == 0
    assert "beta * s * (1 - s)" in capsys.readouterr().out
    assert main(["why", "swish", "--exercises", str(folder)]) == 0
    assert "s + beta x s (1 - s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "old, new, key",
    [
        (
            "dx = dout * (self.s + self.x * self.beta * self.s * (1 - self.s))",
            "dx = dout * self.beta * self.s * (1 - self.s)",
            "swish-no-product-rule",
        ),
        ("self.x * self.beta * self.s", "self.x * self.s", "swish-no-beta"),
    ],
)
def test_a_known_mistake_is_named(tmp_path, folder, capsys, bwrap, old, new, key):
    path = _solution(tmp_path, folder, capsys)
    path.write_text(path.read_text().replace(old, new))
    assert main(["check", "swish", str(path), "--exercises", str(folder), "--format", "json"]) == 1
    res = json.loads(capsys.readouterr().out)
    failed = [i for i in res["items"] if i["passed"] is False]
    assert res["named"] == [key] and failed[0]["named"] == [key] and failed[0]["name"] == "gradient: dx"
    assert all(i["name"].startswith("configuration ") and i["named"] == [] for i in failed[1:])  # judged on its own


def test_graded_as_a_class(tmp_path, folder, capsys, bwrap):
    subs = tmp_path / "subs"
    subs.mkdir()
    right = _solution(tmp_path, folder, capsys).read_text()
    (subs / "ann.py").write_text(right)
    (subs / "ben.py").write_text(right.replace("self.x * self.beta * self.s", "self.x * self.s"))
    assert main(["grade", "swish", str(subs), "--out", str(tmp_path / "out"), "--exercises", str(folder)]) == 0
    rows = (tmp_path / "out" / "grades.csv").read_text().splitlines()
    # seven items each: the forward, dx, the second backward, the inputs unchanged, central differences, two more
    # configurations; ben's wrong dx costs dx and the two configurations, the rest is judged on its own
    assert rows[1].startswith("ann,7,7,right,") and rows[2].startswith("ben,4,7,wrong,swish-no-beta,")
    assert "1  swish-no-beta" in (tmp_path / "out" / "summary.txt").read_text()


@pytest.mark.parametrize(
    "spec, says",
    [
        ("CLASS = 'Swish'\nINPUTS = {'x': (4, 6)}\n", "has no reference"),
        ("CLASS = 'Swish'\nINPUTS = {'x': (4, -6)}\ndef reference(x):\n    return x\n", "must be a shape"),
        (
            "CLASS = 'Swish'\nINPUTS = {'x': (4, 6)}\nMISTAKES = [('k', 'dx')]\ndef reference(x):\n    return x\n",
            "MISTAKES[0] must be",
        ),
    ],
)
def test_a_spec_that_cannot_be_used_is_refused_in_one_line(tmp_path, capsys, spec, says):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "swish_spec.py").write_text(spec)
    try:
        assert main(["list", "--exercises", str(d)]) == 2
    finally:
        unregister()
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


def test_a_built_in_name_is_refused(tmp_path, capsys):
    d = tmp_path / "clash"
    d.mkdir()
    (d / "linear_spec.py").write_text("CLASS = 'Linear'\nINPUTS = {'x': (2, 3)}\ndef reference(x):\n    return x\n")
    assert main(["list", "--exercises", str(d)]) == 2
    assert "built-in exercise" in capsys.readouterr().err


def test_a_notebook_of_a_teachers_exercise_checks_itself(tmp_path, folder, capsys):
    """The check cell registers the teacher's folder first: run in a fresh kernel, it finds the exercise."""
    import nbformat

    path = tmp_path / "swish.ipynb"
    assert main(["start", "swish", "--notebook", "--solution", "--out", str(path), "--exercises", str(folder)]) == 0
    unregister()  # as a kernel starts: nothing registered
    namespace = {}
    for k, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type == "code":
            exec(compile(cell.source, f"<cell {k}>", "exec"), namespace)
    assert "PASS" in capsys.readouterr().out
