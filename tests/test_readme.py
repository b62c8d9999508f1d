"""Every ```python block of README.md and of each page of docs/ runs as written, in order, one namespace a page, as a
notebook runs its cells (a block may use what the blocks before it on the same page defined), in a fresh folder
holding a tiny dataset in ./data: a snippet that rots fails here, with a traceback pointing at its line of the
page.  Bash blocks are not run.  Every page of docs/ is linked from the README or from another page."""
import re
from pathlib import Path

import pytest

from tests.conftest import write_tiny_mnist

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


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
