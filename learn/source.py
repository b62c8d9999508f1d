"""One source, two texts: the worked solution, and the learner's stub made by cutting out its answer regions.

As nbgrader does, the answer sits between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` in
``learn/exercises/NAME.py``; the stub replaces each region by ``# YOUR CODE HERE`` and a
``raise NotImplementedError``, so the stub can never drift from the solution that the tests check.  The
``{check}`` line of the docstring becomes the rules and the exact command that checks the file.
"""

from __future__ import annotations

import re

from .exercises import Exercise
from .files import check_command

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
_DEF = re.compile(r"^    def (\w+)\(")
_CLASS = re.compile(r"^class (\w+)")

_RULES = {
    "value": "Plain Python floats and the math module: no torch here.",
    "adam": "Plain tensor operations in float64: no torch.optim.",
}
_LAYER_RULES = (
    "Plain tensor operations in float64: no autograd (no .backward(), no requires_grad), no torch.nn\n"
    "layers.  A gradient is added into .grad as PyTorch adds it: create .grad when it is None, then\n"
    "+= into it (a second backward adds to the first).  Do not change dout or the inputs in place."
)


_RULES["linear_split"] = _LAYER_RULES + (
    "\nB then W must equal the given fused backward() bit for bit: the same operations on the same tensors."
)
_RULES["tensor_parallel"] = _LAYER_RULES + (
    "\nA rank's tensors are the entries of a Python list, one per rank; ranks talk only through all_reduce()."
)


def check_block(ex: Exercise, file: str) -> str:
    """The end of the exercise's docstring: the rules, how to check, what a right answer looks like."""
    extra = f" --exercises {ex.folder}" if hasattr(ex, "folder") else ""  # a teacher's exercise: where its spec is
    return (
        f"\n{_RULES.get(ex.name, _LAYER_RULES)}\n\n"
        f"Check it (in a notebook: run its last cell):\n"
        f"    {check_command(ex.name, file)}{extra}\n"
        f"A right answer prints PASS, every number equal to PyTorch's to about 1e-15 (float64 round-off;\n"
        f"the check accepts up to 1e-9).  A wrong one prints the tensor, its worst entry (expected and\n"
        f"yours) and, most often, the mistake by name.  Stuck?  python -m learn hint {ex.name}{extra}\n"
        f"(--level 2, then 3, say more; --solution on start writes the worked answer)."
    )


def _raw(ex: Exercise) -> list[str]:
    return ex.source.read_text().splitlines()


def solution_text(ex: Exercise, file: str) -> str:
    """The worked solution: the source without its region markers."""
    lines = [ln for ln in _raw(ex) if ln.strip() not in (BEGIN, END)]
    return "\n".join(lines).replace("{check}", check_block(ex, file)) + "\n"


def stub_text(ex: Exercise, file: str) -> str:
    """The learner's file: each answer region replaced by a NotImplementedError naming the method."""
    out, inside, method, cls = [], False, "?", ex.cls
    for ln in _raw(ex):
        m, c = _DEF.match(ln), _CLASS.match(ln)
        if m:
            method = m.group(1)
        if c:  # a file may hold several classes (tensor_parallel's f, g and Linears): name the one to fill in
            cls = c.group(1)
        if ln.strip() == BEGIN:
            inside = True
            indent = ln[: len(ln) - len(ln.lstrip())]
            out += [
                f"{indent}# YOUR CODE HERE",
                f'{indent}raise NotImplementedError("{cls}.{method}: not written yet")',
            ]
        elif ln.strip() == END:
            inside = False
        elif not inside:
            out.append(ln)
    if inside:
        raise ValueError(f"{ex.source}: a {BEGIN} without its {END}")
    return "\n".join(out).replace("{check}", check_block(ex, file)) + "\n"


def _register(ex: Exercise) -> str:
    """A teacher's exercise is found by its folder (learn/teach/custom.py): the check cell registers it first."""
    if not hasattr(ex, "folder"):
        return ""
    return f"from learn.teach.custom import register\nregister({str(ex.folder)!r})\n"


def notebook(ex: Exercise, code: str):
    """The exercise as a Jupyter notebook (nbformat 4): a title, the code to fill in, the check last."""
    import nbformat

    title = code.split('"""')[1].splitlines()[0] if code.startswith('"""') else ex.name
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            f"# {title}\n\nFill in the parts marked `# YOUR CODE HERE` in the next cell "
            f"and run it, then run the last cell to check your class against PyTorch.\n"
            f"Hints: `python -m learn hint {ex.name}` in a terminal, or "
            f"`!python -m learn hint {ex.name}` here."
        ),
        nbformat.v4.new_code_cell(code.rstrip("\n")),
        nbformat.v4.new_code_cell(
            _register(ex) + f"from learn.cell import check\n\n"  # raises on a wrong answer
            f"check({ex.name!r}, {ex.cls})  # PASS, or an AssertionError naming the mistake"
        ),
    ]
    nb.cells[-1].metadata["handgrad"] = {"check": ex.name}  # how a checker finds the check cell (learn/files.py)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb
