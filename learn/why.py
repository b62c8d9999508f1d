"""python -m learn why NAME: why the exercise's backward is right, derived in a few lines, and where to read more.

``text(name)`` is the derivation (``learn/derivations.py``) followed by its pointers: handgrad's own layer, whose
backward is the textbook version, and the steps of the step-through page that apply it.
``pointer(name)`` is the one line a hint or a named mistake adds to send the learner there.
"""

from __future__ import annotations

from .derivations import DERIVATIONS
from .exercises import get
from .files import check_command


def pointer(name: str) -> str:
    """One line that sends the learner to the derivation: for hints and for the checker's named mistakes."""
    ex = get(name)
    return f"Why it is right, derived with shapes:  python -m learn why {ex.name}"


def text(name: str) -> str:
    """The derivation of exercise ``name``'s backward, then where the same math lives in handgrad."""
    ex = get(name)
    d = DERIVATIONS[ex.name]
    lines = [f"Why {ex.cls}'s backward is what it is ({ex.name}: {ex.teaches})", "", d.text, "", "Read more:"]
    lines.append(f"  handgrad's own:        {d.library}")
    if d.reference:
        lines.append(f"  in the same file:      {d.reference}")
    if d.page:
        lines += [
            "  on the page:           python -m learn show --out xor.html, the steps",
            f"                         {d.page}",
        ]
    return "\n".join(lines) + "\n"


def main(args) -> int:
    print(text(args.name), end="")
    print(f"\nYour file checked against it:  {check_command(args.name)}")
    return 0
