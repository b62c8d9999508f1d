"""The model-parallel exercises check what only they can get wrong: linear_split's B then W must equal the fused
backward bit for bit, leave .grad to W, keep its own dout and add once per B; tensor_parallel's shards must be the
right blocks (views of the one-process parameters), every rank must hold the same result, and the sharded MLP
must equal one process.  Each such failure is said in plain words and no wrong answer passes."""

import pytest
import torch

from learn.checker import check_path, planned
from learn.checker.specs.tensor_parallel import _sharded
from learn.exercises import BY_NAME
from learn.files import check_command
from learn.source import solution_text
from tests.test_learn_mistakes import learner_file


def test_a_split_right_to_round_off_but_not_bit_for_bit_fails_and_says_why(tmp_path):
    """dW as a sum of outer products from the last row to the first: right to about 1e-16, but another order of
    additions (summed first to last, the rows may add up in a GEMM's own order, bit for bit)."""
    report = check_path(
        "linear_split",
        learner_file(
            tmp_path,
            "linear_split",
            [
                (
                    "dweight, dbias = dout.T @ self.x, dout.sum(0)",
                    "dweight, dbias = sum(torch.outer(a, b) for a, b in zip(dout.flip(0), self.x.flip(0))),"
                    " dout.sum(0)",
                )
            ],
        ),
    )
    text = report.text()
    assert not report.passed and report.named == [] and "not bit for bit" in text, text
    assert report.items["B then W equal the fused backward bit for bit"].passed is False


def test_a_w_that_refuses_when_no_b_is_pending_passes(tmp_path):
    report = check_path(
        "linear_split",
        learner_file(
            tmp_path,
            "linear_split",
            [
                (
                    "            return  # one W per B",
                    "            raise RuntimeError('backward_weight() with no backward_input() before it')  #",
                )
            ],
        ),
    )
    assert report.passed and "a W with no B refused" in report.text(), report.text()


def test_the_fused_backward_given_must_stay_right(tmp_path):
    report = check_path(
        "linear_split",
        learner_file(
            tmp_path,
            "linear_split",
            [
                (
                    "        dx = dout @ self.weight  # (N, D)\n        for p, g in",
                    "        dx = 2 * dout @ self.weight  # (N, D)\n        for p, g in",
                )
            ],
        ),
    )
    assert not report.passed and "fused backward() (given) is wrong" in report.text(), report.text()


def test_shards_copied_instead_of_viewed_are_caught_at_the_layout(tmp_path):
    """A copy never sees the parameters the checker (or an optimizer) writes into the one-process tensor."""
    report = check_path(
        "tensor_parallel",
        learner_file(
            tmp_path,
            "tensor_parallel",
            [
                (
                    "self.weights = shard(weight, 0, ranks)  # rows",
                    "self.weights = [w.clone() for w in shard(weight, 0, ranks)]  # rows",
                )
            ],
        ),
    )
    text = report.text()
    assert not report.passed and report.named == [] and "layout is wrong: self.fc1.weights" in text, text
    assert "is each shard a view of the parameter" in text


def test_a_rank_that_holds_another_result_is_caught(tmp_path):
    """Rank 0 right, rank 1 not: the returned out cannot show it; every rank's copy is compared."""
    report = check_path(
        "tensor_parallel",
        learner_file(
            tmp_path,
            "tensor_parallel",
            [
                (
                    "return [out + self.bias for out in outs]",
                    "return [out + self.bias * (1 + r) for r, out in enumerate(outs)][:1] + outs[1:]",
                )
            ],
        ),
    )
    text = report.text()
    assert not report.passed and "rank 1's outs differs from rank 0's" in text, text
    assert report.items["every rank holds the same result"].passed is False


def test_the_replay_of_the_sharded_mlp_is_the_one_process_mlp():
    """The mistakes' replay with no mistake switched on equals the one-process MLP and its autograd gradients."""
    g = torch.Generator().manual_seed(0)
    leaves = {
        "x": torch.randn(4, 3, generator=g, dtype=torch.float64),
        "weight1": torch.randn(6, 3, generator=g, dtype=torch.float64),
        "bias1": torch.randn(6, generator=g, dtype=torch.float64),
        "weight2": torch.randn(9, 6, generator=g, dtype=torch.float64),
        "bias2": torch.randn(9, generator=g, dtype=torch.float64),
    }
    dout = torch.randn(4, 9, generator=g, dtype=torch.float64)
    t = {n: v.clone().requires_grad_() for n, v in leaves.items()}
    out = torch.tanh(t["x"] @ t["weight1"].T + t["bias1"]) @ t["weight2"].T + t["bias2"]
    grads = torch.autograd.grad((out * dout).sum(), list(t.values()))
    from types import SimpleNamespace

    replay = _sharded(SimpleNamespace(**leaves, dout=dout, ranks=3))
    torch.testing.assert_close(replay["out"], out.detach(), rtol=1e-13, atol=1e-13)
    for name, grad in zip(["dx", "weight1.grad", "bias1.grad", "weight2.grad", "bias2.grad"], grads, strict=True):
        torch.testing.assert_close(replay[name], grad, rtol=1e-13, atol=1e-13, msg=name)


@pytest.mark.parametrize(
    "name, items",
    [
        ("linear_split", ["B: dx", "B leaves .grad alone", "one W per B: a W with no B before it adds nothing"]),
        (
            "tensor_parallel",
            ["layout: each rank's shards", "every rank holds the same result", "gradient: weight1.grad"],
        ),
    ],
)
def test_a_grader_sees_each_checked_item(name, items):
    names = planned(name)
    assert all(i in names for i in items) and len(names) == len(set(names)), names


def test_the_solutions_are_one_source_with_the_stub():
    for name in ("linear_split", "tensor_parallel"):
        text = solution_text(BY_NAME[name], f"{name}.py")
        assert check_command(name, f"{name}.py") in text and "### BEGIN" not in text


def test_dw_computed_in_b_is_found_wherever_b_keeps_it(tmp_path):
    """B that computes dW (the GEMM W should do later) gives right numbers; what it kept gives it away."""
    report = check_path(
        "linear_split",
        learner_file(
            tmp_path,
            "linear_split",
            [
                (
                    "        self.pending = dout.clone()  # (N, H)",
                    "        self.cache = {'dw': dout.T @ self.x}\n        self.pending = dout.clone()  # (N, H)",
                )
            ],
        ),
    )
    assert report.named == ["split-dw-in-b"] and "your self.cache.dw holds dweight computed in B" in report.text()


def test_a_grad_created_as_zeros_in_b_is_no_mistake(tmp_path):
    report = check_path(
        "linear_split",
        learner_file(
            tmp_path,
            "linear_split",
            [
                (
                    "        self.pending = dout.clone()  # (N, H)",
                    "        for p in (self.weight, self.bias):\n            if p.grad is None:\n"
                    "                p.grad = torch.zeros_like(p)\n        self.pending = dout.clone()  # (N, H)",
                )
            ],
        ),
    )
    assert report.passed, report.text()
