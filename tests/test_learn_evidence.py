"""The checker's verdict from all the evidence: every configuration run and every item judged on its own, a second
backward after one forward, inputs large enough to overflow an exp, and a name given only when it fits every
configuration and expression."""

import pytest
import torch

from learn.checker import check_path, planned
from learn.checker.configs import expand
from learn.checker.layer_check import ACCUMULATE, AGAIN, GRADIENT, UNCHANGED, reference_call
from learn.checker.specs import SPECS
from tests.test_learn_mistakes import learner_file


def test_a_stable_formula_of_its_own_passes_where_an_overflowing_one_fails(tmp_path):
    """1 / (1 + exp(-x)) is right at x = -800 (1 / inf = 0); exp(x) / (1 + exp(x)) is nan at x = 800."""
    right = check_path(
        "sigmoid", learner_file(tmp_path, "sigmoid", [("out = torch.sigmoid(x)", "out = 1 / (1 + torch.exp(-x))")])
    )
    assert right.passed, right.text()
    wrong = check_path(
        "sigmoid",
        learner_file(tmp_path, "sigmoid", [("out = torch.sigmoid(x)", "out = torch.exp(x) / (1 + torch.exp(x))")]),
    )
    assert not wrong.passed and wrong.named == ["exp-overflow"] and "exp(x) is inf past x = 709" in wrong.text()


@pytest.mark.parametrize(
    "name, tensor",
    [("sigmoid", "x"), ("tanh", "x"), ("gelu", "x"), ("softmax_cross_entropy", "logits"), ("attention", "scores")],
)
def test_every_exercise_whose_forward_exponentiates_is_checked_past_709(name, tensor):
    spec, biggest = SPECS[name], 0.0
    for _label, cfg in expand(spec):
        g = torch.Generator().manual_seed(cfg.seed)
        params = {n: make(g) for n, make in cfg.params.items()}
        ctx = reference_call(cfg, params, cfg.inputs(g), g).ctx
        t = ctx.q @ ctx.k.transpose(1, 2) * ctx.q.shape[-1] ** -0.5 if tensor == "scores" else getattr(ctx, tensor)
        biggest = max(biggest, t.abs().max().item())
    assert biggest >= 709, (name, biggest)


def test_a_backward_that_changes_its_own_cache_is_caught_by_a_second_backward(tmp_path):
    """Right once: MSE's self.diff *= 2 ... gives the right gradient, then a wrong one after the same forward."""
    report = check_path(
        "mse",
        learner_file(
            tmp_path,
            "mse",
            [
                (
                    "dinput = 2 * self.diff / self.diff.numel()",
                    "self.diff *= 2\n        self.diff /= self.diff.numel()\n        dinput = self.diff",
                )
            ],
        ),
    )
    assert not report.passed and report.named == ["cache-changed-in-place"], report.text()
    assert report.items[AGAIN].passed is False and report.items[GRADIENT.format("dinput")].passed is True


def test_a_backward_that_refuses_a_second_call_passes(tmp_path):
    report = check_path(
        "relu",
        learner_file(
            tmp_path,
            "relu",
            [
                (
                    "        dx = dout * self.mask\n",
                    "        if self.mask is None:\n"
                    "            raise RuntimeError('backward twice after one forward')\n"
                    "        dx = dout * self.mask\n        self.mask = None\n",
                )
            ],
        ),
    )
    assert report.passed and "is refused (backward twice after one forward)" in report.text(), report.text()


def test_each_item_is_judged_on_its_own(tmp_path):
    """One mistake (the bias averaged) costs its own items: the bias's gradient and the configurations where the
    mean differs from the sum; accumulation, the second backward, unchanged inputs and central differences are
    judged right (accumulation against the learner's own second gradient)."""
    report = check_path("linear", learner_file(tmp_path, "linear", [("dbias = dout.sum(0)", "dbias = dout.mean(0)")]))
    items = report.items
    assert [i.name for i in items.values()] == planned("linear")
    failed = [i.name for i in items.values() if not i.passed]
    assert failed == [
        GRADIENT.format("bias.grad"),
        "configuration 3 of 4: wide: N = 3, D = 2, H = 6",
        "configuration 4 of 4: random shapes (seeded): N = 7, D = 5, H = 1",
    ], failed
    assert items[GRADIENT.format("bias.grad")].named == ["bias-mean"]
    assert all(items[n].passed for n in (ACCUMULATE, AGAIN, UNCHANGED))
    assert "each item on its own" in report.text()


def test_an_assigned_grad_is_told_its_formula_is_right_and_its_accumulation_is_not(tmp_path):
    loop = (
        "        for p, g in ((self.weight, dweight), (self.bias, dbias)):\n            if p.grad is None:\n"
        "                p.grad = torch.zeros_like(p)\n            p.grad += g  # accumulate, as PyTorch does\n"
    )
    report = check_path(
        "linear",
        learner_file(
            tmp_path,
            "linear",
            [
                (
                    loop,
                    (
                        "        self.weight.grad = dweight\n        if self.bias.grad is None:\n"
                        "            self.bias.grad = torch.zeros_like(self.bias)\n        self.bias.grad += dbias\n"
                    ),
                )
            ],
        ),
    )
    text = report.text()
    assert report.named == ["grad-overwritten"] and "its formula is right, the accumulation is not" in text, text
    assert "the mistake is in its own formula" not in text
    assert report.items[GRADIENT.format("weight.grad")].passed and not report.items[ACCUMULATE].passed
    assert report.items[AGAIN].passed  # the second backward after one forward behaves as the first: one item lost


def test_a_name_that_fits_one_configuration_but_not_another_is_not_given(tmp_path):
    """Averaged where N = 4, summed elsewhere: the default configuration looks like bias-mean, the wide one (N = 3)
    contradicts it (the learner's bias gradient is right there, bias-mean's is not)."""
    report = check_path(
        "linear",
        learner_file(
            tmp_path,
            "linear",
            [("dbias = dout.sum(0)", "dbias = dout.sum(0) / len(dout) if len(dout) == 4 else dout.sum(0)")],
        ),
    )
    assert not report.passed and report.named == [] and "bias-mean" not in report.text(), report.text()
    assert "WRONG  bias.grad" in report.text()


def test_a_preorder_walk_is_not_called_an_overwrite():
    """The first failing expression cannot tell a pre-order walk from = for +=; the next can: the name that fits
    every expression is given."""
    from learn.checker.value_check import EXPRESSIONS

    assert any("a + a" in label for label, _, _ in EXPRESSIONS)  # an addition reusing a node, beside a * a


def test_families_are_named_from_each_exercises_formula(tmp_path):
    report = check_path(
        "attention",
        learner_file(
            tmp_path,
            "attention",
            [("(datt * self.att).sum(-1, keepdim=True)", "(datt * self.att).sum(1, keepdim=True)")],
        ),
    )
    text = report.text()
    assert report.named == ["wrong-axis"] and "over axis 1 ((datt * att).sum(1, keepdim=True) where" in text, text
    report = check_path(
        "batchnorm", learner_file(tmp_path, "batchnorm", [("dxhat = dout * self.weight", "dxhat = dout * self.bias")])
    )
    assert report.named == ["wrong-saved-tensor"] and "with bias where weight belongs" in report.text()
