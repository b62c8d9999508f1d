"""python -m learn train for adam, value, embedding, lstm_cell, attention, the model-parallel exercises (and every
exercise has a race): a right answer trains exactly as its twin does (torch.optim.Adam and handgrad's Adam;
torch.autograd; handgrad's layers in a character model; handgrad's fused layers in one process), a wrong
one parts at the first step its mistake can show, and a wrong answer whose loss still falls is told that a falling
loss is no gradient check."""

from argparse import Namespace

import pytest
import torch

from learn.exercises import BY_NAME
from learn.race import LEARNING_IS_NO_CHECK, Race, run
from learn.source import solution_text
from learn.train import main
from learn.train_value import two_moons

MORE = [
    "adam",
    "rmsprop",
    "sgd_momentum",
    "value",
    "broadcast",
    "accumulate",
    "embedding",
    "lstm_cell",
    "gru_cell",
    "attention",
    "linear_split",
    "tensor_parallel",
    "ring_attention",
    "moe_dispatch",
]


def write(tmp_path, name, changes=()):
    path = tmp_path / f"{name}.py"
    text = solution_text(BY_NAME[name], str(path))
    for old, new in changes:
        assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in the {name} solution"
        text = text.replace(old, new)
    path.write_text(text)
    return path


def train(path, name, steps=3):
    return main(Namespace(name=name, file=str(path), steps=steps, plot=None, seed=0))


@pytest.mark.parametrize("name", MORE)
def test_a_right_answer_trains_as_its_twin_does(tmp_path, capsys, name):
    assert train(write(tmp_path, name), name) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "AGREE: 3 steps" in out
    if name == "adam":
        assert "torch.optim.Adam and handgrad Adam do" in out
    if name in ("embedding", "lstm_cell", "gru_cell", "attention"):
        assert "Shakespeare" in out
    if name == "tensor_parallel":
        assert "over 4 simulated ranks beside one process" in out


@pytest.mark.parametrize(
    "name, changes",
    [
        ("adam", [("m_hat = m / (1 - beta1 ** self.t)", "m_hat = m")]),  # no bias correction of m
        ("value", [("self.grad += (1 - t ** 2) * out.grad", "self.grad += (1 - self.data ** 2) * out.grad")]),
        (
            "embedding",
            [
                (
                    "dweight.index_add_(0, self.idx.reshape(-1), dout.reshape(-1, dout.shape[-1]))",
                    "dweight[self.idx] += dout",
                )
            ],
        ),  # repeated ids do not add up
        ("lstm_cell", [("dc = dc_total * f  # (N, H): through the forget gate", "dc = dc_total")]),
        ("attention", [("dq = dscores @ self.k * self.scale", "dq = dscores @ self.k")]),
        (
            "linear_split",
            [("dweight, dbias = dout.T @ self.x, dout.sum(0)", "dweight, dbias = dout.T @ self.x, dout.mean(0)")],
        ),
        ("tensor_parallel", [("return douts  # each", "return all_reduce(douts)  #")]),  # g's backward all-reduces
        ("rmsprop", [("(v.sqrt() + self.eps)", "(v + self.eps).sqrt()")]),
        ("sgd_momentum", [("self.buf[k] = d.clone()", "self.buf[k] = (1 - self.momentum) * d")]),  # an average
        ("broadcast", [("dshift = self.sum_to(dout, shift_shape)", "dshift = self.sum_to(dout, shift_shape) / 2")]),
        ("accumulate", [("self.layer.backward(2 * diff / count)", "self.layer.backward(2 * diff / diff.numel())")]),
        ("gru_cell", [("dr, dh_n = da_n * h_n, da_n * r", "dr, dh_n = da_n * h_n, da_n")]),
        (
            "ring_attention",
            [
                (
                    "torch.exp(qs[r] @ ks[b].transpose(1, 2) * self.scale - lses[r])",
                    "torch.softmax(qs[r] @ ks[b].transpose(1, 2) * self.scale, -1)",
                )
            ],
        ),  # the block's lse
        ("moe_dispatch", [("dx.index_add_(0, tokens, dy @ self.weight[e])", "dx[tokens] = dy @ self.weight[e]")]),
    ],
)
def test_a_wrong_gradient_or_update_parts_at_step_2(tmp_path, capsys, name, changes):
    assert train(write(tmp_path, name, changes), name) == 1
    out = capsys.readouterr().out
    assert "PART at step 2" in out and "<- they part" in out, out


def test_every_exercise_has_a_race():
    from learn.train import NETWORKS
    from learn.train_more import RACES

    assert set(NETWORKS) | set(RACES) == set(BY_NAME) and not set(NETWORKS) & set(RACES)


def test_a_wrong_forward_parts_at_step_1(tmp_path, capsys):
    path = write(tmp_path, "attention", [("self.scale = d ** -0.5", "self.scale = d ** -1.0")])
    assert train(path, "attention") == 1
    assert "PART at step 1: the forward differs" in capsys.readouterr().out


def test_a_wrong_gradient_that_still_learns_is_no_gradient_check(tmp_path, capsys):
    path = write(tmp_path, "linear", [("dbias = dout.sum(0)", "dbias = dout.mean(0)")])
    assert train(path, "linear", steps=30) == 1
    out = capsys.readouterr().out
    assert "PART at step 2" in out and LEARNING_IS_NO_CHECK in out


def test_the_race_reports_the_first_step_where_the_learner_leaves_every_twin(tmp_path, capsys):
    mine = {1: 2.0, 2: 1.5, 3: 1.2, 4: 1.0}
    race = Race(
        ["a made-up race"], lambda k: mine[k], {"a": lambda k: mine[k] if k < 3 else 1.3, "b": lambda k: mine[k]}
    )
    assert run(race, BY_NAME["linear"], "linear.py", 4, None) == 1
    out = capsys.readouterr().out
    assert "PART at step 3" in out and "     3 " in out and "<- they part" in out
    assert LEARNING_IS_NO_CHECK in out  # 2.0 -> 1.0: it fell
    race = Race(["agree"], lambda k: 1.0, {"a": lambda k: 1.0 + 1e-12})
    assert run(race, BY_NAME["linear"], "linear.py", 3, None) == 0 and "AGREE: 3 steps" in capsys.readouterr().out


def test_two_moons_are_two_interleaved_half_circles():
    x, y = two_moons(400, 0.0, torch.Generator().manual_seed(0))
    assert x.shape == (400, 2) and set(y.tolist()) == {-1.0, 1.0} and (y == 1).sum() == 200
    upper, lower = x[y == -1], x[y == 1]
    assert torch.allclose((upper**2).sum(1), torch.ones(200, dtype=x.dtype))  # radius 1 around (0, 0)
    assert torch.allclose(
        ((lower - torch.tensor([1.0, 0.5], dtype=x.dtype)) ** 2).sum(1), torch.ones(200, dtype=x.dtype)
    )  # radius 1 around (1, 0.5), the lower half
    assert (upper[:, 1] >= 0).all() and (lower[:, 1] <= 0.5).all()
