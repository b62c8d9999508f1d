"""A setting, declared once: a field of one of the configuration's parts, with its name, type, default, help and
range in the field's metadata.  The command line (command_line.py) is built from these declarations, each part
checks its own values against them, and the resume and rank-agreement rules read them.

    batch_size: int = setting(per_model(image=128, text=12), "samples per step ... (default: {image} images,
                              {text} windows of text)", type=int, low=1, keeps="math")

A per-model setting's field is typed as TrainConfig makes it, the model known: ``int`` where every model has a
value, ``int | None`` where some have none (--hidden: the GPT's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

from layers.checks import is_a

from ..errors import UsageError
from .choices import GROUPS, flag


@dataclass(frozen=True)
class PerModel:
    """A default that depends on the run's model: the model's own value, else that of a group it is in
    (choices.GROUPS: "recurrent", its family "image" or "text"), else None (the setting is unused there)."""

    values: dict

    def of(self, model: str | None, family: str):
        """The default for ``model`` (None: not chosen yet, its family's) of ``family``."""
        if model in self.values:
            return self.values[model]
        group = next((g for g in self.values if model in GROUPS.get(g, ())), family)
        return self.values.get(group)


def per_model(**values) -> PerModel:
    return PerModel(values)


@dataclass(frozen=True)
class Setting:
    help: str | Callable[[], str]  # a callable where the text reads this machine (--threads: its cores)
    default: object = None  # the value, or a PerModel filled in once the model is known
    type: type | tuple = str  # what a value must be
    parse: Callable | None = None  # the command line's text -> value, ValueError naming the forms it takes
    choices: tuple | None = None  # the values allowed
    listed: bool = True  # the command line lists (and enforces) the choices
    low: int | None = None  # an integer setting's smallest value
    form: str = "value"  # "value"; "switch" (--x); "negated" (--no-x); "either" (--x, --no-x);
    const: object = None  # "optional" (--x [VALUE]): the bare flag's value
    metavar: str | None = None
    group: str | None = None  # the help's section: None, "text" or "parallel"
    shares: str | None = None  # another setting whose flag also sets this one, when given one of its choices
    keeps: str = ""  # on --resume: "math" (the numbers depend on it: the checkpoint's is kept, a
    #                                  different one given refused); "record" (kept unless given again); "" (now)
    local: bool = False  # may differ between the ranks of one run (paths, printing)
    applies: tuple | None = None  # the models or families ("image", "text") it applies to; None: all
    key: str = ""  # the name outside its part (TrainConfig(key=...)); default: the field's name
    field: str = ""  # the field's name in its part

    @property
    def flag(self) -> str:
        return flag(f"no_{self.key}") if self.form == "negated" else flag(self.key)

    @property
    def varies(self) -> bool:
        return isinstance(self.default, PerModel)

    def help_text(self) -> str:
        """The help as --help prints it: the declared text, its per-model defaults filled in, and "(default: X)"
        after it where it does not state its default itself and there is one to state."""
        text = self.help() if callable(self.help) else self.help
        if isinstance(self.default, PerModel):  # self.varies, spelled so the type checker narrows it
            return text.format(**self.default.values)
        if self.default is None or self.default is False or self.form == "negated" or "(default" in text:
            return text
        return f"{text} (default: {self.default})"

    def applies_to(self, model: str, family: str) -> bool:
        return self.applies is None or model in self.applies or family in self.applies

    def check(self, value):
        """``value`` of this setting checked on its own -> the value (a path as a Path); UsageError naming it."""
        if value is None:
            if self.default is None or self.varies:
                return None
            raise UsageError(f"{self.flag} must be given a value, not None")
        if self.type is Path:
            if str(value) == "":  # Path("") is the current folder: never what an empty argument meant
                raise UsageError(f"{self.flag} is empty; give a path")
            return Path(value)
        if self.type is bool and type(value) is not bool:
            name = f"{self.key} ({self.flag})" if self.form == "negated" else self.flag
            raise UsageError(f"{name} must be True or False, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise UsageError(
                f"{self.flag}: unknown {self.key} {value!r}; known: {', '.join(str(c) for c in self.choices)}"
            )
        if self.low is not None:
            if not is_a(value, int):
                raise UsageError(f"{self.flag} must be an integer, got {value!r}")
            if value < self.low:
                raise UsageError(f"{self.flag} {value} is out of range (at least {self.low})")
        return value


_T = TypeVar("_T")


@overload
def setting(default: PerModel, help: str | Callable[[], str], **declared: Any) -> Any: ...
@overload
def setting(default: _T, help: str | Callable[[], str], **declared: Any) -> _T: ...
def setting(default: Any, help: str | Callable[[], str], **declared: Any) -> Any:
    """A part's field declared as a setting (see Setting); a per-model default leaves the field None until the
    configuration knows the model.  Typed as dataclasses.field is, as the field's value: a plain default must be of
    the field's type; a per-model one is taken for it (TrainConfig fills it in before it makes the part)."""
    s = Setting(help=help, default=default, **declared)
    return dataclasses.field(default=None if s.varies else default, metadata={"setting": s})


def settings_of(part) -> list[Setting]:
    """The settings a part (class or instance) declares, in order, each knowing its key and field."""
    out = []
    for f in dataclasses.fields(part):
        s = f.metadata.get("setting")
        if s is not None:
            out.append(dataclasses.replace(s, key=s.key or f.name, field=f.name))
    return out


def check_part(part) -> None:
    """Every setting of a (frozen) part checked on its own; paths become Paths."""
    for s in settings_of(part):
        object.__setattr__(part, s.field, s.check(getattr(part, s.field)))


def check_fraction(name: str, value) -> None:
    """A setting that must lie in [0, 1) (dropout, beta2): a number there, or a UsageError naming it."""
    if not is_a(value, (int, float)) or not 0.0 <= value < 1.0:
        raise UsageError(f"{flag(name)} {value} is out of range (need a number in [0, 1))")
