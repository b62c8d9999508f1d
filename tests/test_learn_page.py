"""The step-through page: build_walk's numbers equal torch.autograd's, and the page, clicked through in headless
Chromium, reveals them node by node, the backward's only once reached, ends with an SGD update that lowers the loss,
names the mistake a wrong prediction matches, links each step to its exercise, and fits a 1280 x 800 window; the
README's picture of it is the page as it is.

The browser tests need Debian's Chromium and its driver (``apt-get install chromium chromium-driver``) and
selenium.  Without Chromium they are skipped, saying what to install, except where ``$CI`` is set (CI installs
it: a missing browser there is a failure); HANDGRAD_SKIP_BROWSER=1 skips them on purpose anywhere.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from learn.exercises import BY_NAME
from learn.page import LR, build_walk, write_page
from learn.page_predict import wrong_answers

ROOT = Path(__file__).resolve().parents[1]
SEED = 7  # its weights make some gradients print as 3.901e-5: the exponent form is checked too
FORWARD = ["z1", "h", "z2", "y", "loss"]  # the node each forward step computes, in order
BACKWARD = ["loss", "y", "z2", "W2", "b2", "h", "z1", "W1", "b1"]  # the gradient each backward step reveals
GIVEN = ["x", "t", "W1", "b1", "W2", "b2"]  # shown from the start
LOCAL = ["dloss_dy", "dy_dz2", "dh_dz1"]  # the local derivatives the backward's arithmetic shows
UPDATE = ["W1_new", "b1_new", "W2_new", "b2_new", "loss_new", "loss_change"]  # what the SGD step reveals
AUX = ["y_new", "lr"]  # numbers the update's arithmetic shows besides


def autograd_reference(seed: int) -> dict[tuple[str, str], torch.Tensor]:
    """The same network built with torch.nn and plain torch ops, its gradients from torch.autograd (float64).

    -> {(tensor, "value" or "grad"): tensor}, with the page's names; the local derivatives also by autograd."""
    f64 = torch.float64
    torch.manual_seed(seed)
    fc1, fc2 = torch.nn.Linear(2, 2, dtype=f64), torch.nn.Linear(2, 1, dtype=f64)
    x = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=f64)
    t = torch.tensor([[0], [1], [1], [0]], dtype=f64)
    z1 = fc1(x)
    h = torch.tanh(z1)
    z2 = fc2(h)
    y = torch.sigmoid(z2)
    loss = ((y - t) ** 2).mean()
    for v in (z1, h, z2, y, loss):
        v.retain_grad()
    loss.backward()

    def local(f, at: torch.Tensor) -> torch.Tensor:
        """d f(at) / d at, element by element (f acts element-wise)."""
        leaf = at.detach().requires_grad_()
        return torch.autograd.grad(f(leaf).sum(), leaf)[0]

    values = {
        "x": x,
        "t": t,
        "W1": fc1.weight,
        "b1": fc1.bias,
        "W2": fc2.weight,
        "b2": fc2.bias,
        "z1": z1,
        "h": h,
        "z2": z2,
        "y": y,
        "loss": loss,
        "dloss_dy": local(lambda v: ((v - t) ** 2).mean(), y),
        "dy_dz2": local(torch.sigmoid, z2),
        "dh_dz1": local(torch.tanh, z1),
    }
    with torch.no_grad():  # one SGD step, and the forward again with its weights
        new = {
            f"{k}_new": p - LR * p.grad
            for k, p in (("W1", fc1.weight), ("b1", fc1.bias), ("W2", fc2.weight), ("b2", fc2.bias))
        }
        y_new = torch.sigmoid(torch.tanh(x @ new["W1_new"].T + new["b1_new"]) @ new["W2_new"].T + new["b2_new"])
        loss_new = ((y_new - t) ** 2).mean()
    values |= new | {
        "y_new": y_new,
        "loss_new": loss_new,
        "loss_change": loss_new - loss,
        "lr": torch.tensor(LR, dtype=f64),
    }
    grads = {
        "loss": loss.grad,
        "y": y.grad,
        "z2": z2.grad,
        "W2": fc2.weight.grad,
        "b2": fc2.bias.grad,
        "h": h.grad,
        "z1": z1.grad,
        "W1": fc1.weight.grad,
        "b1": fc1.bias.grad,
    }
    return {(k, "value"): v.detach() for k, v in values.items()} | {(k, "grad"): g for k, g in grads.items()}


def at(reference: dict, tensor: str, kind: str, index: str) -> float:
    """The reference number a page element names (data-tensor, data-kind, data-index)."""
    return reference[(tensor, kind)][tuple(int(i) for i in index.split(",")) if index else ()].item()


def check_printed(text: str, expected: float, where: str) -> None:
    """``text`` is ``expected`` as printed: to at least 4 significant digits, within half a unit of its last digit
    (an integer must be exact)."""
    m = re.fullmatch(r"-?(\d+)(?:\.(\d+))?(?:e([+-]?\d+))?", text)
    assert m, f"{where}: {text!r} is not a number"
    if m.group(2) is None and m.group(3) is None:
        assert float(text) == expected, f"{where}: shows {text}, expected exactly {expected!r}"
        return
    digits = (m.group(1) + (m.group(2) or "")).lstrip("0")
    assert len(digits) >= 4, f"{where}: {text!r} has fewer than 4 significant digits"
    half_unit = 0.5 * 10.0 ** (int(m.group(3) or 0) - len(m.group(2) or ""))
    assert abs(float(text) - expected) <= half_unit * (1 + 1e-9), (
        f"{where}: shows {text}, but the reference is {expected!r} (allowed: half a unit of the last digit)"
    )


# ---- build_walk, without a browser ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, SEED])
def test_build_walk_equals_autograd(seed):
    walk, reference = build_walk(seed), autograd_reference(seed)
    assert set(walk["tensors"]) == set(GIVEN + FORWARD + LOCAL + UPDATE + AUX)
    for name, t in walk["tensors"].items():
        for kind in ("value", "grad"):
            if kind not in t:
                assert (name, kind) not in reference, f"build_walk lost dL/d{name}"
                continue
            got = torch.tensor(t[kind], dtype=torch.float64)
            want = reference[(name, kind)]
            assert got.shape == want.shape, f"{name} {kind}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15, msg=f"{name} {kind} differs from torch")
    assert set(BACKWARD) == {name for name, t in walk["tensors"].items() if "grad" in t}


def test_build_walk_steps_reveal_forward_then_backward_in_order():
    steps = build_walk(SEED)["steps"]
    assert [s["phase"] for s in steps] == ["start"] + ["forward"] * 5 + ["backward"] * 9 + ["update"]
    assert steps[0]["reveal"] == [[name, "value"] for name in GIVEN]
    assert [s["reveal"] for s in steps[1:6]] == [[[name, "value"]] for name in FORWARD]
    assert [s["reveal"] for s in steps[6:15]] == [[[name, "grad"]] for name in BACKWARD]
    assert [(s["number"], s["of"]) for s in steps[6:15]] == [(k, 9) for k in range(1, 10)]
    assert steps[15]["reveal"] == [[name, "value"] for name in UPDATE]


def test_build_walk_arithmetic_adds_up_and_uses_only_what_is_known():
    """Every step's written-out arithmetic gives the number it reveals, and uses only numbers already revealed
    (or local derivatives): a gradient is used only once complete, in reverse topological order."""
    walk = build_walk(SEED)
    tensors = walk["tensors"]

    def number(ref):
        v = tensors[ref[0]][ref[1]]
        for i in filter(None, ref[2].split(",")):
            v = v[int(i)]
        return v

    known = set()
    for k, step in enumerate(walk["steps"]):
        new = {tuple(r) for r in step["reveal"]}
        for e in step["entries"]:
            assert tuple(e["result"][:2]) in new, f"step {k}: {e['label']} is not what the step reveals"
            if "fn" in e:
                used, got = (
                    [e["arg"]],
                    {"tanh": math.tanh, "sigmoid": lambda v: 1 / (1 + math.exp(-v))}[e["fn"]](number(e["arg"])),
                )
            elif "mse" in e:
                used = [r for pair in e["mse"] for r in pair]
                got = sum((number(y) - number(t)) ** 2 for y, t in e["mse"]) / len(e["mse"])
            elif e["terms"]:
                used = [f for term in e["terms"] + e.get("minus", []) for f in term]
                got = sum(math.prod(number(f) for f in term) for term in e["terms"]) - sum(
                    math.prod(number(f) for f in term) for term in e.get("minus", [])
                )
            else:
                used, got = [], 1.0  # dL/dL
            assert got == pytest.approx(number(e["result"]), rel=1e-12, abs=1e-15), f"step {k}: {e['label']}"
            for ref in used:
                assert tuple(ref[:2]) in known or ref[0] in LOCAL + AUX, (
                    f"step {k}: {e['label']} uses {ref}, which the walk has not revealed yet"
                )
            known.add(tuple(e["result"][:2]))  # a later line of the same step may use it
        if step["phase"] == "backward":
            assert step["ask"] == step["entries"][0]["result"]
        known |= new


def test_page_is_one_file_that_asks_nothing_of_the_network(tmp_path):
    page = write_page(tmp_path / "sub" / "page.html", seed=SEED)
    html = page.read_text(encoding="utf-8")
    assert "@@" not in html, "a slot of page.html was left unfilled"
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(['\"]?(https?:)?//", html), (
        "the page loads something from elsewhere"
    )
    assert set(re.findall(r"https?://[^\s\"'`)]+", html)) <= {"http://www.w3.org/2000/svg"}, (
        "the page names an address other than the SVG namespace"
    )


# ---- the page in headless Chromium -----------------------------------------------------------------------

SCREENSHOT = importlib.util.spec_from_file_location("page_screenshot", ROOT / "scripts" / "page_screenshot.py")
screenshot = importlib.util.module_from_spec(SCREENSHOT)
SCREENSHOT.loader.exec_module(screenshot)
CHROMIUM_FLAGS = screenshot.FLAGS  # the README's picture is taken in the browser these tests drive
INSTALL = "apt-get install chromium chromium-driver"


def missing_browser(programs: list[str], env) -> tuple[str, str] | None:
    """None when every program is there; else ("skip", why), or ("fail", why) where $CI is set (CI installs them)."""
    missing = [p for p in programs if not os.access(p, os.X_OK)]
    if not missing:
        return None
    why = (
        f"{' and '.join(missing)} not found: the step-through page is tested in a real browser; install "
        f"Debian's with `sudo {INSTALL}`"
    )
    if env.get("CI", "").lower() not in ("", "0", "false"):
        return "fail", f"{why} (CI={env['CI']}: a missing browser fails here)"
    return "skip", why


def test_a_missing_browser_is_a_skip_that_says_why_except_in_ci(tmp_path):
    there, gone = "/bin/sh", str(tmp_path / "chromium")
    assert missing_browser([there], {}) is None and missing_browser([there], {"CI": "true"}) is None
    assert missing_browser([gone, there], {}) == (
        "skip",
        f"{gone} not found: the step-through page is tested in a real browser; install Debian's with `sudo {INSTALL}`",
    )
    assert missing_browser([gone], {"CI": "false"})[0] == "skip"
    kind, why = missing_browser([gone], {"CI": "true"})
    assert kind == "fail" and why.endswith("(CI=true: a missing browser fails here)")


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for this file's tests, driven by selenium with Debian's chromedriver."""
    if os.environ.get("HANDGRAD_SKIP_BROWSER") == "1":
        pytest.skip("HANDGRAD_SKIP_BROWSER=1: the page is not opened in a browser")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    chromedriver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    verdict = missing_browser([chromium, chromedriver], os.environ)
    if verdict is not None and verdict[0] == "fail":
        pytest.fail(verdict[1], pytrace=False)
    if verdict is not None:
        pytest.skip(verdict[1])
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail(
            "selenium is not installed: pip install -e '.[dev]' (or set HANDGRAD_SKIP_BROWSER=1 to skip on purpose)",
            pytrace=False,
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    with tempfile.TemporaryDirectory(prefix="handgrad-chromium-") as profile, pytest.MonkeyPatch.context() as mp:
        mp.setenv("SE_OFFLINE", "1")  # selenium-manager must never try to download a browser or a driver
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(chromedriver), options=options)
        try:
            yield driver
        finally:
            driver.quit()


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    return write_page(tmp_path_factory.mktemp("page") / "xor.html", seed=SEED)


# Every element that names a number: [tensor, kind, index, text, visible].
NUMBERS_JS = """
return Array.from(document.querySelectorAll('[data-tensor]')).map(e => [e.dataset.tensor, e.dataset.kind,
  e.dataset.index, e.textContent, e.checkVisibility({visibilityProperty: true, opacityProperty: true})]);
"""
# The page's visible text with every number element taken out: no decimal number may be left in it.
TEXT_WITHOUT_NUMBERS_JS = """
const clone = document.body.cloneNode(true);
clone.querySelectorAll('[data-tensor], script').forEach(e => e.remove());
return clone.innerText;
"""


def open_page(browser, page: Path) -> None:
    browser.get(page.as_uri())
    assert browser.execute_script("return document.querySelectorAll('[data-tensor]').length") > 100, (
        "the page drew no numbers (a script error?)"
    )


def visible_numbers(browser, reference: dict, where: str) -> set[tuple[str, str, str]]:
    """Check every visible number against the reference; -> the (tensor, kind, index) of those visible."""
    shown = set()
    for tensor, kind, index, text, visible in browser.execute_script(NUMBERS_JS):
        assert kind in ("value", "grad"), f"{where}: {tensor}[{index}] has data-kind {kind!r}"
        if visible:
            check_printed(text, at(reference, tensor, kind, index), f"{where}, {kind} of {tensor}[{index}]")
            shown.add((tensor, kind, index))
    return shown


def expected_pairs(step: int) -> set[tuple[str, str]]:
    """The (tensor, kind) pairs shown on the graph once ``step`` (0 = the start) is reached."""
    values = GIVEN + FORWARD[: min(step, 5)] + (UPDATE if step >= 15 else [])
    return {(v, "value") for v in values} | {(g, "grad") for g in BACKWARD[: max(0, step - 5)]}


def test_page_walks_forward_then_backward_and_shows_autograds_numbers(browser, page):
    reference = autograd_reference(SEED)
    open_page(browser, page)
    nxt, back = browser.find_element("id", "next"), browser.find_element("id", "back")
    assert not back.is_enabled()
    states = []
    for step in range(16):
        where = f"step {step}"
        shown = visible_numbers(browser, reference, where)
        pairs = {(t, k) for t, k, _ in shown}
        if step <= 5:
            assert not any(k == "grad" for _, k in pairs), f"{where}: a gradient is visible before the backward pass"
        # exactly what has been reached, besides the local derivatives of the step's own arithmetic
        assert pairs - {(name, "value") for name in LOCAL + AUX} == expected_pairs(step), where
        new = expected_pairs(step) - (expected_pairs(step - 1) if step else set())
        for tensor, kind in new:  # every entry of the newly revealed tensor is on the graph
            indices = {i for t, k, i in shown if (t, k) == (tensor, kind)}
            assert len(indices) == max(1, math.prod(reference[(tensor, kind)].shape)), f"{where}: {tensor} {kind}"
        heading = (
            "Start"
            if step == 0
            else f"Forward, step {step} of 5"
            if step <= 5
            else f"Backward, step {step - 5} of 9"
            if step < 15
            else "Update: one SGD step"
        )
        assert heading in browser.find_element("id", "steps").text, where
        if step == 8:  # dL/dz2 = dL/dy x y(1 - y): the sigmoid's backward, linked to its exercise
            assert "python -m learn start sigmoid" in browser.find_element("id", "steps").text, where
        stray = re.findall(r"-?\d*\.\d+", browser.execute_script(TEXT_WITHOUT_NUMBERS_JS))
        assert not stray, f"{where}: numbers shown outside a data-tensor element: {stray}"
        states.append(shown)
        assert nxt.is_enabled() == (step < 15), where
        if step < 15:
            nxt.click()
    assert back.is_enabled()

    # Back undoes a step exactly (here the first weight gradient), Next redoes it
    for _ in range(15 - 9):
        back.click()
    assert visible_numbers(browser, reference, "step 9") == states[9]
    back.click()
    assert visible_numbers(browser, reference, "back to step 8") == states[8]
    assert not any(t == "W2" and k == "grad" for t, k, _ in states[8])
    nxt.click()
    assert visible_numbers(browser, reference, "step 9 again") == states[9]

    # every number on the page, shown or not, equals torch's (values) or torch.autograd's (gradients)
    for tensor, kind, index, text, _ in browser.execute_script(NUMBERS_JS):
        check_printed(text, at(reference, tensor, kind, index), f"{kind} of {tensor}[{index}]")


def test_page_writes_the_update_as_a_subtraction(browser, page):
    """On the update step each weight reads "W1′[0,0] = 0.1234 − 1 × (−0.5678) = ...", never "+ (−1) ×"."""
    open_page(browser, page)
    nxt = browser.find_element("id", "next")
    for _ in range(15):
        nxt.click()
    lines = [e.text for e in browser.find_elements("css selector", "#work .work.update .entry")]
    assert len(lines) == 4 + 2 + 2 + 1 + 2, lines  # W1, b1, W2, b2 entry by entry, loss′, loss′ − loss
    num = r"\(?-?[\d.]+(?:e[+-]?\d+)?\)?"
    for line in lines[:9]:
        assert re.fullmatch(rf"[Wb][12]′\[[\d,]+\] = {num} − {LR:g} × {num} = {num}", line), line
    assert re.fullmatch(rf"loss′ − loss = {num} − {num} = {num}", lines[-1]), lines[-1]
    assert not any(minus_one in line for line in lines for minus_one in ("(-1)", "(−1)")), lines


def test_page_predict_first_asks_before_revealing(browser, page):
    reference = autograd_reference(SEED)
    open_page(browser, page)
    browser.find_element("id", "predict").click()
    nxt = browser.find_element("id", "next")
    for _ in range(5 + 2 + 2 + 1):  # the forward pass, dL/dL and dL/dy (each asked, then shown), then dL/dz2
        nxt.click()
    # now asked for dL/dz2[0,0], with dL/dz2 nowhere to be seen
    ask = browser.find_element("id", "ask")
    assert ask.is_displayed() and "dL/dz2[0,0]" in ask.text
    assert not any(t == "z2" and k == "grad" for t, k, _ in visible_numbers(browser, reference, "asking"))
    guess, verdict = browser.find_element("id", "guess"), browser.find_element("id", "verdict")
    answer = reference[("z2", "grad")][0, 0].item()
    downstream = reference[("y", "grad")][0, 0].item()  # dL/dy[0,0]: the local derivative forgotten
    for typed, word in (
        (f"{answer * 1.1:.3g}", "Not quite. Look again"),
        (f"{downstream:.3g}", "Not quite: that is dL/dy itself: the local derivative y(1 − y) is missing"),
        (f"{answer:.3g}", "Right"),
    ):
        guess.clear()
        guess.send_keys(typed)
        browser.find_element("id", "check").click()
        assert verdict.text.startswith(word), f"typed {typed} for {answer}: {verdict.text!r}"
    nxt.click()
    assert not ask.is_displayed()
    shown = visible_numbers(browser, reference, "after the answer")
    assert ("z2", "grad", "0,0") in shown


def test_page_fits_a_1280_by_800_window_with_the_arithmetic_in_view(browser, page):
    """At every step, in both modes, in the viewport a 1280 x 800 window leaves below its bars (1280 x 657): nothing
    is cut at the right, nothing scrolls, and the lines entry by entry end above the fold."""
    open_page(browser, page)
    size = browser.get_window_size()
    width, height = screenshot.VIEWPORT
    try:
        screenshot.set_viewport(browser, width, height)
        open_page(browser, page)
        for predict in (False, True):
            if predict:
                browser.find_element("id", "predict").click()
            nxt = browser.find_element("id", "next")
            while True:
                where = f"{'predict ' if predict else ''}frame {browser.find_element('id', 'progress').text}"
                page_width, page_height, loss_right, work_bottom = browser.execute_script("""
                  const shown = Array.from(document.querySelectorAll('#work .work, #ask'))
                    .filter(e => e.checkVisibility());
                  return [document.documentElement.scrollWidth, document.documentElement.scrollHeight,
                          document.getElementById('node-loss').getBoundingClientRect().right,
                          Math.max(0, ...shown.map(e => e.getBoundingClientRect().bottom))];""")
                assert page_width <= width and loss_right <= width, (
                    f"{where}: {page_width} px wide, the loss node ends at {loss_right}"
                )
                assert page_height <= height and work_bottom <= height, (
                    f"{where}: {page_height} px tall, the arithmetic ends at {work_bottom}"
                )
                if not nxt.is_enabled():
                    break
                nxt.click()
    finally:
        browser.set_window_size(size["width"], size["height"])


def test_the_readmes_picture_is_the_page_as_it_is(browser, tmp_path):
    """scripts/page_screenshot.py's picture, taken now, equals the committed one: a changed page without a new
    picture fails here.  A pixel counts as changed where a colour channel moved by more than 32 of 255, so that a
    renderer's anti-aliasing may differ where the page does not."""
    import numpy
    from PIL import Image, ImageChops

    size = browser.get_window_size()
    try:
        now = Image.open(screenshot.shoot(browser, tmp_path / "now.png")).convert("RGB")
    finally:
        browser.set_window_size(size["width"], size["height"])
    committed = Image.open(screenshot.FIGURE).convert("RGB")
    redo = f"run python scripts/page_screenshot.py to take it again (this one is in {tmp_path / 'now.png'})"
    assert now.size == committed.size, f"the README's picture is {committed.size}, the page {now.size}: {redo}"
    changed = int((numpy.asarray(ImageChops.difference(now, committed)).max(axis=-1) > 32).sum())
    assert changed <= 10, f"the README's picture differs from the page in {changed} pixels: {redo}"


@pytest.mark.parametrize("seed", [0, SEED])
def test_the_last_step_updates_the_weights_and_the_loss_falls(seed):
    walk = build_walk(seed)
    t = walk["tensors"]
    assert t["loss_new"]["value"] < t["loss"]["value"] and t["loss_change"]["value"] < 0
    update = walk["steps"][-1]
    assert update["phase"] == "update" and update["entries"][-1]["label"] == "loss′ − loss"


def test_the_update_subtracts_instead_of_adding_a_negative_constant():
    """W′ = W − lr × dL/dW and loss′ − loss are written as subtractions of positive factors, not as a sum with a
    factor of −1 (the page shows the arithmetic as it is written)."""
    walk = build_walk(SEED)
    assert walk["tensors"]["lr"]["value"] == LR > 0
    update = walk["steps"][-1]["entries"]
    for e in update[:-2]:
        name, _, index = e["result"]
        assert e["terms"] == [[[name[: -len("_new")], "value", index]]], e["label"]
        assert e["minus"] == [[["lr", "value", ""], [name[: -len("_new")], "grad", index]]], e["label"]
    assert update[-1]["terms"] == [[["loss_new", "value", ""]]] and update[-1]["minus"] == [[["loss", "value", ""]]]


@pytest.mark.filterwarnings("error")
def test_the_walk_and_its_wrong_answers_read_numbers_without_a_warning():
    """The parameters require a gradient; their numbers are read from detached tensors (no UserWarning about
    converting a tensor that requires grad to a scalar), whoever passes them."""
    walk = build_walk(SEED)
    t = walk["tensors"]
    values = {k: torch.tensor(v["value"], dtype=torch.float64, requires_grad=True) for k, v in t.items()}
    grads = {k: torch.tensor(v["grad"], dtype=torch.float64) for k, v in t.items() if "grad" in v}
    assert wrong_answers(values, grads) == {s["node"]: s["mistakes"] for s in walk["steps"][6:15]}


@pytest.mark.parametrize("seed", [0, SEED])
def test_predict_modes_named_mistakes_differ_from_the_right_answer(seed):
    walk = build_walk(seed)
    for step in walk["steps"][6:15]:
        right = torch.tensor(walk["tensors"][step["ask"][0]]["grad"], dtype=torch.float64)
        right = right[tuple(int(i) for i in step["ask"][2].split(","))] if step["ask"][2] else right
        assert len(step["mistakes"]) >= 2, step["node"]
        for m in step["mistakes"]:
            assert abs(m["value"] - right.item()) > 1e-3 * abs(right.item()), f"{step['node']}: {m['says']}"
            assert m["says"].startswith(("that", "the")), m["says"]


def test_every_step_but_the_start_names_its_exercise():
    steps = build_walk(0)["steps"]
    assert steps[0]["exercise"] is None
    assert all(s["exercise"] in BY_NAME for s in steps[1:])
    assert [s["exercise"] for s in steps[1:6]] == ["linear", "tanh", "linear", "sigmoid", "mse"]
    assert steps[-1]["phase"] == "update" and steps[-1]["exercise"] == "sgd_momentum"  # an SGD step: SGD's exercise
