"""learn why: every exercise has a derivation of 5 to 20 lines with shapes, whose pointers name things that exist (the
library's file, class and functions, the page's steps); the last hint and the checker's pointer send the learner to
it; and the figures it quotes are the ones its formulas give."""

import importlib
import re
from pathlib import Path

import pytest

from learn.__main__ import main
from learn.derivations import DERIVATIONS
from learn.exercises import BY_NAME, EXERCISES
from learn.page import build_walk
from learn.why import pointer, text

ROOT = Path(__file__).resolve().parents[1]


def test_every_exercise_has_one():
    assert list(DERIVATIONS) == [e.name for e in EXERCISES]


@pytest.mark.parametrize("name", list(BY_NAME))
def test_a_derivation_is_short_has_shapes_and_points_to_what_exists(name):
    d = DERIVATIONS[name]
    assert 5 <= len(d.text.splitlines()) <= 20 and max(map(len, d.text.splitlines())) <= 115
    if name not in ("value", "adam"):  # scalars, and an update of any shape
        assert re.search(r"\([A-Z0-9][\w ]*(, [\w +]+)+\)", d.text), "no shape such as (N, D) in the derivation"
    file, cls = d.library.split(": ", 1)
    assert (ROOT / file).is_file()
    module = importlib.import_module(file[:-3].replace("/", "."))
    if d.reference:
        for fn in re.findall(r"\w+", d.reference):
            assert callable(getattr(module, fn)), fn
    assert isinstance(getattr(module, cls.split()[0]), type)
    if d.page:
        formulas = " ".join(s["formula"] for s in build_walk(0)["steps"])
        for grad in re.findall(r"dL/d\w+", d.page):
            assert grad in formulas, f"{grad} is no step of the page"
    out = text(name)
    assert out.startswith(f"Why {BY_NAME[name].cls}'s backward") and "handgrad's own:" in out


def test_the_command_prints_it(capsys):
    assert main(["why", "softmax_cross_entropy"]) == 0
    out = capsys.readouterr().out
    assert "dz = (p - onehot(y)) / N" in out
    assert "losses/cross_entropy.py: CrossEntropyLoss" in out


def test_the_last_hint_and_the_checkers_pointer_lead_to_it(capsys):
    assert main(["hint", "batchnorm", "--level", "3"]) == 0
    assert "python -m learn why batchnorm" in capsys.readouterr().out
    assert pointer("lstm_cell").endswith("python -m learn why lstm_cell")
    with pytest.raises(KeyError, match="no exercise called"):
        pointer("lstm")


def test_adams_figures_are_what_its_formula_gives():
    """Without bias correction the step is lr (1 - b1^t) / sqrt(1 - b2^t) times the corrected one."""
    factor = lambda t: (1 - 0.9**t) / (1 - 0.999**t) ** 0.5  # noqa: E731
    peak = max(range(1, 5000), key=factor)
    said = DERIVATIONS["adam"].text
    assert f"{factor(1):.1f} lr at t = 1" in said and f"{factor(peak):.1f} lr at t = {peak}" in said
    assert f"{factor(1000):.2f} lr at t = 1000" in said
