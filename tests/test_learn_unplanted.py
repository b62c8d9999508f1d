"""Mistakes that are not in the catalogue still get a useful report: the numbers, what the difference looks like,
central differences of the learner's own forward, and where to look."""

import pytest

from learn.checker import check_path
from tests.test_learn_mistakes import learner_file

UNPLANTED = [  # (exercise, changes, what the report must say)
    (
        "linear",
        [("dx = dout @ self.weight ", "dx = 2 * dout @ self.weight ")],
        [
            "dx is the right one times 2",
            "central differences of your own forward there give",
            "= the expected value",
            "look at: dx = dout @ weight",
        ],
    ),
    (
        "batchnorm",
        [("dx = self.rstd / n * (n * dxhat", "dx = self.rstd / n * (dxhat")],
        ["WRONG  dx: worst at dx[", "entries of dx are wrong", "look at: dx's three terms"],
    ),
    (
        "lstm_cell",
        [("return dx, dh, dc", "return dx, dc, dh")],
        ["your dh equals the expected dc: two results swapped"],
    ),
    (
        "attention",
        [("return dq, dk, dv", "return dk, dq, dv")],
        ["your dq equals the expected dk: two results swapped"],
    ),
    (
        "conv2d",
        [("dbias = dout.sum((0, 2, 3))", "dbias = dout.sum((0, 2))")],
        ["tried to put a tensor of shape (3, 6) into bias.grad (3,)", "on that line: param.grad (3,), g (3, 6)"],
    ),
    (
        "maxpool2d",
        [("(winner * dout[:, :, i, j, None])", "(winner.roll(1, -1) * dout[:, :, i, j, None])")],
        ["WRONG  dx: worst at dx[", "look at: each window's dout goes to the input that won its max"],
    ),
    (
        "softmax_cross_entropy",
        [("dlogits /= n", "dlogits /= n + 1")],
        ["dlogits is the right one times 0.8 (= 1/1.25) everywhere"],
    ),
    ("relu", [("return dx", "return None")], ["dx: expected a tensor of shape (3, 5), got None"]),
    ("tanh", [("out = torch.tanh(x)", "out = torch.tanh(x) + 1")], ["forward is wrong.  out: worst at out["]),
    (
        "value",
        [("other.grad += out.grad", "other.grad -= out.grad")],
        ["WRONG   a + b", "b.grad: expected 1, yours -1", "no known mistake gives these numbers"],
    ),
    ("adam", [("(v_hat.sqrt() + self.eps)", "v_hat.sqrt()")], ["step 1, parameter", "no known mistake"]),
    (
        "embedding",
        [("out = self.weight[idx]", "out = self.weight[idx.T]")],
        ["out: expected shape (2, 5, 3), got (5, 2, 3)"],
    ),
    (
        "tensor_parallel",
        [("gb += dy.sum(0)", "gb += 3 * dy.sum(0)")],
        ["bias1.grad is the right one times 3", "look at: rank r's da_r.sum(0) into its rows of bias1.grad"],
    ),
    (
        "linear_split",
        [("dx = dout @ self.weight  # (N, D): all", "dx = -(dout @ self.weight)  #")],
        ["B's dx is wrong", "dx has the wrong sign everywhere", "look at: dx = dout @ weight"],
    ),
]


@pytest.mark.parametrize("name, changes, says", UNPLANTED, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(UNPLANTED)])
def test_an_unknown_mistake_gets_the_numbers_and_a_pointer(tmp_path, name, changes, says):
    report = check_path(name, learner_file(tmp_path, name, changes))
    text = report.text()
    assert not report.passed and "Traceback" not in text
    assert not [k for k in report.named if k != "not-written"], text  # nothing named: these are not in the catalogue
    for phrase in says:
        assert phrase in text, text
