"""`learn check --format gradescope|json`: one test per checked item, in Gradescope's results.json form, made from
the checker's structured result: a right answer scores every point, a wrong one fails the item where the mistake
is, with the mistake's key as a tag, a file that cannot be checked scores nothing; the exit status is the text
report's."""

import json

import pytest

from learn.__main__ import main
from learn.checker import planned
from learn.exercises import get
from learn.source import solution_text

pytestmark = pytest.mark.usefixtures("bwrap")  # --format json|gradescope is a grader's check: inside bubblewrap
TEST_KEYS = {"name", "score", "max_score", "status", "output", "output_format", "visibility", "tags", "extra_data"}


def _write(tmp_path, name, changes=(), file=None):
    text = solution_text(get(name), "x.py")
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / (file or f"{name}.py")
    path.write_text(text)
    return path


def _run(capsys, *argv):
    code = main(["check", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_a_right_answer_scores_every_item(tmp_path, capsys):
    code, res = _run(capsys, "linear", str(_write(tmp_path, "linear")), "--format", "gradescope")
    assert code == 0
    names = [t["name"] for t in res["tests"]]
    assert names == planned("linear")
    assert {
        "forward: out",
        "gradient: dx",
        "gradient: weight.grad",
        "gradient: bias.grad",
        "accumulation: a second backward adds into each .grad",
        "inputs and dout left unchanged",
    } <= set(names)
    assert sum(n.startswith("configuration ") for n in names) == 3
    for t in res["tests"]:
        assert set(t) == TEST_KEYS and t["status"] == "passed" and t["score"] == t["max_score"] == 1.0
    assert res["score"] == len(names)


def test_a_wrong_bias_gradient_fails_that_item_and_tags_the_mistake(tmp_path, capsys):
    path = _write(tmp_path, "linear", [("dbias = dout.sum(0)", "dbias = dout.mean(0)")])
    code, res = _run(capsys, "linear", str(path), "--format", "gradescope")
    assert code == 1
    by = {t["name"]: t for t in res["tests"]}
    assert by["forward: out"]["status"] == "passed" and by["gradient: dx"]["status"] == "passed"
    bias = by["gradient: bias.grad"]
    assert bias["status"] == "failed" and bias["score"] == 0 and bias["tags"] == ["bias-mean"]
    assert "bias.grad" in bias["output"] and "FAIL" in bias["output"]
    assert by["configuration 2 of 4: one example (N = 1)"]["status"] == "passed"  # N = 1: the mean is the sum
    later = by["configuration 3 of 4: wide: N = 3, D = 2, H = 6"]
    assert later["status"] == "failed" and later["tags"] == []
    for item in (
        "accumulation: a second backward adds into each .grad",
        "inputs and dout left unchanged",
        "central differences of your forward agree with the gradients",
        "gradient: weight.grad",
    ):
        assert by[item]["status"] == "passed", item  # judged on its own: one mistake costs its own items only
    assert res["score"] == sum(t["score"] for t in res["tests"]) == len(res["tests"]) - 3  # bias.grad, 2 configs


def test_a_broken_file_fails_every_item_and_exits_2(tmp_path, capsys):
    path = tmp_path / "linear.py"
    path.write_text("class Linear(\n")
    code, res = _run(capsys, "linear", str(path), "--format", "gradescope")
    assert code == 2 and res["score"] == 0
    assert [t["name"] for t in res["tests"]] == planned("linear")
    assert "not valid Python" in res["tests"][0]["output"]
    assert all(t["status"] == "failed" for t in res["tests"])


@pytest.mark.parametrize("name", ["value", "adam", "softmax_cross_entropy"])
def test_json_lists_each_item_for_every_kind_of_check(tmp_path, capsys, name):
    code, res = _run(capsys, name, str(_write(tmp_path, name)), "--format", "json")
    assert code == 0 and res["verdict"] == "right" and res["exit_status"] == 0
    assert [i["name"] for i in res["items"]] == planned(name)
    assert all(i["passed"] is True for i in res["items"]) and res["score"] == res["max_score"] == len(res["items"])
    assert res["report"].rstrip().splitlines()[-1].startswith("PASS")


def test_a_wrong_adam_fails_from_its_first_wrong_step(tmp_path, capsys):
    path = _write(
        tmp_path,
        "adam",
        [("m_hat = m / (1 - beta1 ** self.t)", "m_hat = m"), ("v_hat = v / (1 - beta2 ** self.t)", "v_hat = v")],
    )
    code, res = _run(capsys, "adam", str(path), "--format", "json")
    assert code == 1 and res["verdict"] == "wrong" and res["named"]
    assert res["items"][0]["name"] == "step 1" and res["items"][0]["passed"] is False
    assert res["items"][0]["named"] == res["named"]
    assert all(i["passed"] is None for i in res["items"][1:])
