"""Every ```python block of README.md and of each page of docs/ runs as written, in order, one namespace a page, as a
notebook runs its cells (a block may use what the blocks before it on the same page defined), in a fresh folder
holding a tiny dataset in ./data: a snippet that rots fails here, with a traceback pointing at its line of the
page.  README.md's blocks also run each alone, in a fresh Python process, as a reader pastes one.  Its bash blocks
are not run; the commands they name are checked: each script or module exists and takes the arguments given, and
CI (.ci/run) runs README's install and test commands word for word.  Every page of docs/ is linked from the README
or from another page."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_tiny_mnist

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line of the page where the block's code starts, code) for every ```python block, in order."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in PYTHON_BLOCK.finditer(text)]


def test_python_blocks_are_found():
    text = "intro\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = a\n```\n"
    assert python_blocks(text) == [(3, "a = 1\n"), (9, "b = a\n")]


def test_the_readme_is_a_front_page_over_the_docs():
    text = README.read_text()
    assert len(text.splitlines()) <= 300, "README.md is the front page: keep the reference in docs/"
    assert len(python_blocks(text)) >= 2, "README.md lost its examples?"
    linked = set(re.findall(r"\(docs/([\w-]+\.md)", text))
    for page in PAGES[1:]:
        linked |= set(re.findall(r"\]\(([\w-]+\.md)", page.read_text()))
    assert {p.name for p in PAGES[1:]} <= linked, "a page of docs/ that nothing links to"
    for name in linked:
        assert (ROOT / "docs" / name).exists(), f"a link to docs/{name}, which does not exist"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run_in_order(page, tmp_path, monkeypatch):
    blocks = python_blocks(page.read_text())
    write_tiny_mnist(tmp_path / "data")  # what training.run's example finds in ./data (no network, no real data)
    monkeypatch.chdir(tmp_path)  # whatever the examples write lands here, never in the checkout
    namespace = {"__name__": "__readme__"}
    for line, code in blocks:
        # padded so that a traceback names the page and the failing line's number in it
        exec(compile("\n" * (line - 1) + code, str(page), "exec"), namespace)


@pytest.mark.parametrize("index", range(len(python_blocks(README.read_text()))))
def test_each_readme_block_runs_alone(index, tmp_path):
    line, code = python_blocks(README.read_text())[index]
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, f"README.md's block at line {line}, pasted alone:\n{r.stderr[-3000:]}"
    assert r.stdout.strip(), f"README.md's block at line {line} prints nothing: a reader cannot see it worked"


def readme_commands(program: str = ".venv/bin/python") -> list[list[str]]:
    """The argument lists of README's bash commands that run ``program`` (the project's Python, or ``sh``)."""
    found = []
    for block in BASH_BLOCK.findall(README.read_text()):
        for command in re.split(r"&&|;|\n", block):
            words = shlex.split(command, comments=True)
            if words[:1] == [program]:
                found.append(words[1:])
    return found


def test_readme_commands_name_what_exists_and_take_their_arguments():
    import learn.__main__
    import train

    commands = readme_commands()
    assert [c[:3] for c in commands if c[:2] == ["-m", "learn"]] == [
        ["-m", "learn", s] for s in ("start", "check", "show")
    ]
    for words in commands:
        if words[:2] == ["-m", "learn"]:
            learn.__main__.parser().parse_args(words[2:])  # an unknown command or option exits 2: a failure here
        elif words[:1] == ["train.py"]:
            train.parse_config(words[1:])
        elif words[:2] == ["-m", "pytest"]:
            assert words[2:] in (["-q"], ["-q", "-m", "slow"]), words
        else:
            pytest.fail(f"README.md runs {words}, which this test does not know how to check")
    scripts = readme_commands("sh")
    assert scripts and all((ROOT / words[0]).is_file() for words in scripts), scripts


def test_ci_installs_and_tests_exactly_as_the_readme_says():
    blocks = [b.strip() for b in BASH_BLOCK.findall(README.read_text())]
    cpu, plain = (b for b in blocks if b.startswith("python3 -m venv .venv"))
    assert (
        cpu.replace(".venv/bin/pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu && ", "")
        == plain
    ), "the two set-up commands differ in more than the CPU index"
    test = next(b for b in blocks if b.endswith(".venv/bin/python -m pytest -q"))
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    slow = next(b for b in blocks if b.endswith(".venv/bin/python -m pytest -q -m slow"))
    assert plain in ci and test in ci and slow in ci, "CI must run README's set-up and test commands word for word"
    before = ci[: ci.index(plain)]
    assert not [line for line in before if line.strip() and not line.startswith(("#", "set ", "export ", "cd "))], (
        f"CI does something before README's set-up command that a new user would not: {before}"
    )
    quick = [c for c in (b.strip() for b in blocks) if c.startswith(".venv/bin/python -m learn")][0].splitlines()
    at = [ci.index(line) for line in quick]
    assert at == sorted(at) and ci.index(plain) < at[0] and at[-1] < ci.index(test) < ci.index(slow), (
        "CI runs README's Quick start after its set-up and before its tests, as a learner does, in the README's order"
    )


def test_ci_lints_and_type_checks_right_after_the_install():
    """ruff and mypy are quick: CI runs them first, so a finding fails it before the long steps."""
    blocks = [b.strip() for b in BASH_BLOCK.findall(README.read_text())]
    plain = [b for b in blocks if b.startswith("python3 -m venv .venv")][-1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    after = [line for line in ci[ci.index(plain) + 1 :] if not line.startswith("#")]
    assert after[:3] == [".venv/bin/ruff check .", ".venv/bin/ruff format --check .", ".venv/bin/mypy"], after[:3]


def test_nothing_gitignore_names_is_tracked():
    """A tracked file that .gitignore names reaches every fresh clone (a tracked .venv link broke the set-up)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(
        ["git", "ls-files", "-ci", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert not r.stdout.strip(), f"tracked, though .gitignore names them (git rm --cached them): {r.stdout.split()}"
