"""Never PASS a wrong answer, never name the wrong mistake, show every tensor.

Eighty-five wrong answers written as a learner writes them (tests/learn_wrong_answers.py: right for one
configuration only, within about 1e-8 of right, using autograd, plain mistakes) must all fail; each is named
exactly when the catalogue has its mistake, and never named as another.  A failing configuration is named; a
mistake is named only when its replay is clearly closer to the answer than the right one; a wrong backward gets a
table of every tensor and a line on where the pattern points.
"""

import pytest
import torch

from learn.checker import check_path
from learn.checker.compare import diagnose
from learn.checker.configs import expand
from learn.checker.spec import LayerSpec
from learn.checker.specs import SPECS
from tests.learn_wrong_answers import FRESH, WRONG_ANSWERS
from tests.test_learn_mistakes import learner_file

IDS = [f"{i:02d}-{name}-{kind}" for i, (name, kind, _, _) in enumerate(WRONG_ANSWERS)]


@pytest.mark.parametrize("name, kind, changes, key", WRONG_ANSWERS, ids=IDS)
def test_a_learners_wrong_answer_fails_and_is_named_only_when_true(tmp_path, name, kind, changes, key):
    report = check_path(name, learner_file(tmp_path, name, changes))
    text = report.text()
    assert not report.passed and "Traceback" not in text, text
    named = [k for k in report.named if k not in ("not-written", "recursion")]
    if kind == "autograd":
        assert named == ["autograd-used"] and ("no autograd here" in text or "no torch.optim here" in text), text
    elif key is None:
        assert named == [], text
    else:
        assert named == [key], text
    if kind == "near" and name not in ("value",):
        assert "float32" in text, text


@pytest.mark.parametrize(
    "name, family, changes, key",
    FRESH,
    ids=[f"{i:02d}-{name}-{family}" for i, (name, family, _, _) in enumerate(FRESH)],
)
def test_an_honest_mistake_of_any_family_fails_and_is_named_only_when_true(tmp_path, name, family, changes, key):
    """No wrong answer passes; one the checker can name is named, by that name alone; one it cannot is located
    (the tensor and where to look), never given another's name."""
    report = check_path(name, learner_file(tmp_path, name, changes))
    text = report.text()
    assert not report.passed and "Traceback" not in text, text
    assert [k for k in report.named if k != "not-written"] == ([key] if key else []), text
    if key is None:  # located: the tensor that is wrong, the line that raised, or where to look
        assert any(word in text for word in ("WRONG", "wrong", "raised", "look at")), text


def test_every_layer_exercise_has_several_configurations():
    for spec in SPECS.values():
        if isinstance(spec, LayerSpec):
            configs = expand(spec)
            assert len(configs) >= 3, spec.name
            assert configs[0][0] == "the default" and len({label for label, _ in configs}) == len(configs)


@pytest.mark.parametrize(
    "name, change, config",
    [
        ("conv2d", ("dx = dxp[:, :, p:p + h, p:p + w]", "dx = dxp[:, :, p:-p, p:-p]"), "padding 0"),
        (
            "conv2d",
            ("h, w = dxp.shape[2] - 2 * p, dxp.shape[3] - 2 * p", "h, w = dxp.shape[2] - 2, dxp.shape[3] - 2"),
            "padding 0",
        ),
        (
            "softmax_cross_entropy",
            ("shifted = logits - logits.max(1, keepdim=True).values", "shifted = logits"),
            "large logits",
        ),
        ("linear", ("dbias = dout.sum(0)", "dbias = dout.squeeze().sum(0)"), "one example (N = 1)"),
        ("relu", ("self.mask = x > 0", "self.mask = x >= 0"), "exact zeros"),
        (
            "maxpool2d",
            ("dx[:, :, i * s:i * s + k, j * s:j * s + k] +=", "dx[:, :, i * k:i * k + k, j * k:j * k + k] +="),
            "configuration 1 of",
        ),
    ],
)
def test_an_answer_right_on_one_configuration_fails_on_another_and_the_report_says_which(
    tmp_path, name, change, config
):
    report = check_path(name, learner_file(tmp_path, name, [change]))
    text = report.text()
    assert not report.passed and f"{config}" in text.split("is the one that failed")[0].splitlines()[-1] + text, text
    assert "is the one that failed" in text


def test_max_pool_ties_go_to_one_element(tmp_path):
    changes = [
        ("self.x_shape = x.shape", "self.x_shape = x.shape\n        self.x = x"),
        (
            "winner = torch.nn.functional.one_hot(self.arg[:, :, i, j], k * k).to(dout.dtype)  # (N, C, k*k)",
            "win = self.x[:, :, i * s:i * s + k, j * s:j * s + k].reshape(n, c, k * k)\n"
            "                winner = (win == win.max(-1, keepdim=True).values).to(dout.dtype)",
        ),
    ]
    text = check_path("maxpool2d", learner_file(tmp_path, "maxpool2d", changes)).text()
    assert "FAIL" in text and "(configuration 3, ties" in text, text


def test_softmax_without_the_max_gets_a_stability_diagnosis(tmp_path):
    changes = [("shifted = logits - logits.max(1, keepdim=True).values", "shifted = logits")]
    text = check_path("softmax_cross_entropy", learner_file(tmp_path, "softmax_cross_entropy", changes)).text()
    assert "nan or inf" in text and "subtract each row's max before exp" in text, text


def test_a_float32_adam_state_is_not_named_a_state_reset(tmp_path):
    changes = [
        (
            f"self.{s} = [torch.zeros_like(p) for p in self.params]",
            f"self.{s} = [torch.zeros(p.shape) for p in self.params]",
        )
        for s in "mv"
    ]
    report = check_path("adam", learner_file(tmp_path, "adam", changes))
    assert not report.passed and report.named == [] and "float32" in report.text(), report.text()


def test_a_scalar_has_no_constant_factor():
    lines = diagnose("loss", torch.tensor(2.0, dtype=torch.float64), torch.tensor(1.3, dtype=torch.float64), {})
    assert not any("constant factor" in ln for ln in lines), lines


def test_a_difference_near_round_off_is_called_precision_not_a_mistake():
    e = torch.randn(4, 3, dtype=torch.float64)
    lines = diagnose("dx", e.float().double(), e, {})
    assert len(lines) == 1 and "float32 somewhere" in lines[0]


def test_every_tensor_is_in_the_table_and_the_pattern_points_at_da(tmp_path):
    """An LSTM whose output gate's derivative is applied twice: dc right, dx, dh and every weight gradient wrong."""
    report = check_path(
        "lstm_cell", learner_file(tmp_path, "lstm_cell", [("do = dh_next * tc", "do = dh_next * tc * o * (1 - o)")])
    )
    text = report.text()
    for name in ("dx", "dh", "weight_ih.grad", "weight_hh.grad", "bias_ih.grad", "bias_hh.grad"):
        assert f"WRONG  {name}: worst at" in text, text
    assert "right  dc (relative error" in text and "the relative error is the tensor's" in text
    assert "they share da (N, 4H)" in text and report.named == []


def test_a_mistake_that_equals_the_right_answer_at_a_setting_is_not_named_there(tmp_path):
    """conv-dx-padding-kept gives the right dx at padding 0: it is named at padding 1, where it differs."""
    report = check_path("conv2d", learner_file(tmp_path, "conv2d", [("dx = dxp[:, :, p:p + h, p:p + w]", "dx = dxp")]))
    assert report.named == ["conv-dx-padding-kept"]


@pytest.mark.parametrize(
    "name, before, saved, says",
    [
        (
            "lstm_cell",
            "dx = da @ self.weight_ih  #",
            "{'da': da, 'dc_total': dc_total, 'do': do, 'tc': tc, 'dtc': do}",
            ["exact  da", "exact  dc_total", "exact  do", "exact  tc", "WRONG  dtc"],
        ),
        (
            "attention",
            "dq = dscores @ self.k",
            "{'dscores': dscores, 'datt': datt, 'att': self.att}",
            ["exact  dscores", "exact  datt", "exact  att"],
        ),
        (
            "batchnorm",
            "dx = self.rstd / n",
            "{'dxhat': dxhat, 'xhat': self.xhat, 'rstd': self.rstd}",
            ["exact  dxhat", "exact  xhat", "exact  rstd"],
        ),
        ("layernorm", "dx = self.rstd / d", "{'dxhat': dxhat * 2, 'xhat': self.xhat}", ["WRONG  dxhat", "exact  xhat"]),
        (
            "softmax_cross_entropy",
            "dlogits = self.p.clone()",
            "{'p': self.p, 'zz': self.p}",
            ["exact  p", "?      zz: not a name this exercise knows"],
        ),
        ("conv2d", "dx = dxp[:, :, p:p + h, p:p + w]", "{'dxp': dxp, 'xp': self.xp}", ["exact  dxp", "exact  xp"]),
    ],
)
def test_recorded_intermediates_are_compared_with_autograds(tmp_path, name, before, saved, says):
    """Backprop Ninja's cmp: exact, approximate or wrong for each tensor the learner records in self.saved
    ("approx" for a last-bit difference of summation order)."""
    report = check_path(name, learner_file(tmp_path, name, [(before, f"self.saved = {saved}\n        {before}")]))
    text = report.text().replace("approx", "exact ")
    assert report.passed and "your self.saved, beside autograd's" in text, text
    for phrase in says:
        assert phrase in text, text
