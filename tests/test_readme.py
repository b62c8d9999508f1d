"""Every ```python block of README.md runs as written, in order, as a notebook runs its cells (a block may use
what the blocks before it defined), in a fresh folder holding a tiny dataset in ./data: a snippet that rots fails
here, with a traceback pointing at its line of README.md.  Bash blocks are not run."""
import re
from pathlib import Path

from tests.conftest import write_tiny_mnist

README = Path(__file__).resolve().parents[1] / "README.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line of README.md where the block's code starts, code) for every ```python block, in order."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in PYTHON_BLOCK.finditer(text)]


def test_python_blocks_are_found():
    text = "intro\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = a\n```\n"
    assert python_blocks(text) == [(3, "a = 1\n"), (9, "b = a\n")]


def test_readme_python_blocks_run_in_order(tmp_path, monkeypatch):
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 7, "README.md lost its examples?"
    write_tiny_mnist(tmp_path / "data")  # what training.run's example finds in ./data (no network, no real data)
    monkeypatch.chdir(tmp_path)  # whatever the examples write lands here, never in the checkout
    namespace = {"__name__": "__readme__"}
    for line, code in blocks:
        # padded so that a traceback names README.md and the failing line's number in it
        exec(compile("\n" * (line - 1) + code, str(README), "exec"), namespace)
