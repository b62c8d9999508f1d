"""python -m learn train: a right layer trains as handgrad's does (exit 0), a wrong one parts from it (exit 1).
The exercises outside the image networks (adam, value, embedding, lstm_cell, attention): test_learn_train_more.py."""

from argparse import Namespace

import pytest

import learn.data
from learn.exercises import BY_NAME
from learn.source import solution_text
from learn.train import NETWORKS, main
from tests.test_learn_mistakes import learner_file


def train(path, name, steps=5, plot=None):
    return main(Namespace(name=name, file=str(path), steps=steps, plot=plot, seed=0))


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_a_right_layer_agrees_with_handgrads(tmp_path, capsys, name):
    path = tmp_path / f"{name}.py"
    path.write_text(solution_text(BY_NAME[name], str(path)))
    assert train(path, name, steps=3) == 0, capsys.readouterr().out
    assert "AGREE: 3 steps" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name, changes, step",
    [
        ("linear", [("dbias = dout.sum(0)", "dbias = dout.mean(0)")], 2),  # a wrong gradient: the first update differs
        ("tanh", [("dx = dout * (1 - self.out ** 2)", "dx = dout * (1 - self.out)")], 2),
        ("batchnorm", [("var = ((x - mean) ** 2).mean(0)", "var = x.var(0)")], 1),  # a wrong forward: at once
        ("softmax_cross_entropy", [("        dlogits /= n  # the loss is a mean over the batch\n", "")], 2),
        ("gelu", [("dx = dout * (cdf + x * pdf)", "dx = dout * cdf")], 2),
        ("dropout", [("self.mask = keep / (1 - self.p) if", "self.mask = keep if")], 1),  # not scaled: the forward
    ],
)
def test_a_wrong_layer_parts_from_handgrads(tmp_path, capsys, name, changes, step):
    assert train(learner_file(tmp_path, name, changes), name) == 1
    out = capsys.readouterr().out
    assert f"PART at step {step}" in out and f"{step:>6} " in out and "<- they part" in out


def test_the_plot_shows_both_curves(tmp_path, capsys):
    plot = tmp_path / "curves.png"
    assert (
        train(learner_file(tmp_path, "relu", [("dx = dout * self.mask", "dx = dout * ~self.mask")]), "relu", plot=plot)
        == 1
    )
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_fashion_mnist_a_built_in_task_stands_in(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(learn.data, "PLACES", [tmp_path / "nowhere"])
    path = tmp_path / "sigmoid.py"
    path.write_text(solution_text(BY_NAME["sigmoid"], str(path)))
    assert train(path, "sigmoid") == 0
    assert "a built-in task (Fashion-MNIST not found" in capsys.readouterr().out


def test_an_exception_while_training_is_reported_in_plain_words(tmp_path, capsys):
    path = learner_file(tmp_path, "layernorm", [("dbias = dout.sum(0)", "dbias = dout.sum(1)")])
    assert train(path, "layernorm") == 1
    out = capsys.readouterr().out
    assert "raised RuntimeError at layernorm.py line" in out and "PART at step 1: your code raised" in out
    assert "Traceback" not in out


def test_what_cannot_train_is_refused(tmp_path, capsys):
    assert train(tmp_path / "x.py", "valu") == 2
    assert "no exercise called 'valu'" in capsys.readouterr().out
    assert train(tmp_path / "missing.py", "linear") == 2
    assert "does not exist" in capsys.readouterr().out
