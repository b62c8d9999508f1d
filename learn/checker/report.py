"""A check's result: the lines to print, whether it passed, which known mistakes it named, and each checked
item's outcome (``items``: the forward, each gradient, accumulation, inputs unchanged, each configuration), from
which a grader's per-test results are made (learn/teach/gradescope.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Item:
    """One checked item: passed (True), failed (False), or not reached because an earlier one failed (None)."""

    name: str
    passed: bool | None = None
    named: list[str] = field(default_factory=list)  # the known mistakes named while it failed


@dataclass
class Report:
    title: str
    lines: list[str] = field(default_factory=list)
    passed: bool = True
    named: list[str] = field(default_factory=list)  # keys of the mistakes recognised, in order
    right: str = "every tensor agrees with PyTorch's autograd"  # what PASS means for this exercise
    items: dict[str, Item] = field(default_factory=dict)  # planned first, in the order they are checked
    log: list[str] = field(default_factory=list)  # every key as it was named, repeats kept (for ``items``)

    def say(self, line: str = "") -> None:
        self.lines.append(line)

    def fail(self, line: str, key: str | None = None) -> None:
        self.passed = False
        self.lines.append(line if line.startswith("  ") else "\n".join("  " + ln for ln in line.splitlines()))
        if key is not None:
            self.log.append(key)
            if key not in self.named:
                self.named.append(key)

    def plan(self, *names: str) -> None:
        """Items the check will decide, in order; each stays undecided until ``mark``."""
        for n in names:
            self.items.setdefault(n, Item(n))

    def mark(self, name: str, ok: bool, named=()) -> None:
        """Item ``name`` passed or failed here (``named``: the mistakes named in it); a failure sticks (a later
        call that passes does not undo it)."""
        item = self.items.setdefault(name, Item(name))
        item.named.extend(k for k in named if k not in item.named)
        if item.passed is not False:
            item.passed = bool(ok)

    def settle(self, since: int = 0) -> None:
        """After a failure: the mistakes named since ``log[since]`` go to the failed item; where no item was
        marked failed, the first undecided one takes the failure."""
        failed = [i for i in self.items.values() if i.passed is False and not i.named]
        if not self.passed and not any(i.passed is False for i in self.items.values()):
            first = next((i for i in self.items.values() if i.passed is None), None)
            if first is not None:
                first.passed = False
                failed = [first]
        if failed:
            failed[0].named.extend(k for k in dict.fromkeys(self.log[since:]) if k not in failed[0].named)

    def text(self) -> str:
        verdict = (
            f"PASS: right: {self.right} to round-off (a right answer is within about 1e-15; the check accepts 1e-9)."
            if self.passed
            else "FAIL: see above.  Fix it and run the same command again."
        )
        return "\n".join([self.title, *self.lines, verdict]) + "\n"
