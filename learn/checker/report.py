"""A check's result: the lines to print, whether it passed, and which known mistakes it named."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Report:
    title: str
    lines: list[str] = field(default_factory=list)
    passed: bool = True
    named: list[str] = field(default_factory=list)  # keys of the mistakes recognised, in order
    right: str = "every tensor agrees with PyTorch's autograd"  # what PASS means for this exercise

    def say(self, line: str = "") -> None:
        self.lines.append(line)

    def fail(self, line: str, key: str | None = None) -> None:
        self.passed = False
        self.lines.append(line if line.startswith("  ") else "\n".join("  " + ln for ln in line.splitlines()))
        if key is not None and key not in self.named:
            self.named.append(key)

    def text(self) -> str:
        verdict = (f"PASS: right: {self.right} to round-off (a right answer is within about 1e-15; the check "
                   f"accepts 1e-9)." if self.passed else
                   "FAIL: see above.  Fix it and run the same command again.")
        return "\n".join([self.title, *self.lines, verdict]) + "\n"
