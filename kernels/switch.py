"""An on/off switch read from the environment once, turned in the process, or off for a block: how kernels/ and
kernels/cpp/ each say whether their fast paths run."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_VALUES = {"on": True, "1": True, "off": False, "0": False}


class Switch:
    def __init__(self, owner: str, variable: str) -> None:
        self.owner, self.variable = owner, variable  # who is switched (for messages), and its environment variable
        self.on = self.from_environment()

    def from_environment(self) -> bool:
        value = os.environ.get(self.variable, "on").strip().lower()
        if value not in _VALUES:
            raise ValueError(f"{self.variable} must be 'on' or 'off' (or 1 / 0), got {os.environ[self.variable]!r}")
        return _VALUES[value]

    def enabled(self) -> bool:
        return self.on

    def enable(self, on: bool = True) -> None:
        if not isinstance(on, bool):
            raise TypeError(f"{self.owner}.enable: on must be a bool, got {on!r}")
        self.on = on

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        before, self.on = self.on, False
        try:
            yield
        finally:
            self.on = before
