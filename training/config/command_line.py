"""The command line, derived from the settings' declarations: one argparse option for each setting, with the
declared flag, type, choices and help (and "(default: X)" from the declared default).

Every option's default is argparse.SUPPRESS, so the namespace a parse returns holds exactly the flags that were
given: they are ``TrainConfig.given``, and the settings left out take their declared defaults in TrainConfig, the
one place each default is written.  argparse rather than a library that derives options from dataclasses (tyro,
simple-parsing): those lay out --help their own way, and the command line's help, choices and one-line errors
stay what they were.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, cast

from ..errors import UsageError
from .setting import Setting
from .train_config import SETTINGS, TrainConfig

GROUPS = {
    "text": "text runs (--model gpt, lstm, gru): nanoGPT's option names, its CPU configuration's defaults",
    "parallel": "model parallelism of the GPT under torchrun (docs/model-parallel.md): T x P ranks hold one copy of "
    "the model, data parallelism over the rest of the world size",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the whole usage block
        raise UsageError(f"{message} (see --help)")


def _path(text: str) -> Path:
    if not text:  # Path("") is the current folder, never what an empty argument meant
        raise argparse.ArgumentTypeError("is empty; give a path")
    return Path(text)


def _reader(parse):
    """A declared text -> value function as argparse's type: its ValueError's message becomes argparse's."""

    def read(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return read


class _Shared(argparse.Action):
    """A flag that sets one of two settings whose choices are apart (--schedule: a learning-rate schedule or a
    pipeline schedule), each value to its own, so that both can be given."""

    def __init__(self, *args, other: Setting, **kwargs):
        super().__init__(*args, **kwargs)
        self.other = other

    def __call__(self, parser, namespace, value, option_string=None):
        setattr(namespace, self.other.key if value in self.other.choices else self.dest, value)


def _option(s: Setting, sharers: list[Setting]) -> dict:
    """add_argument's keywords for setting ``s`` (and the settings that share its flag)."""
    kw: dict[str, Any] = {"dest": s.key, "default": argparse.SUPPRESS, "help": s.help_text()}
    if s.form in ("switch", "negated"):
        return {**kw, "action": "store_true" if s.form == "switch" else "store_false"}
    if s.form == "either":
        return {**kw, "action": argparse.BooleanOptionalAction}
    if s.form == "optional":
        kw.update(nargs="?", const=s.const)
    if s.parse is not None:
        kw["type"] = _reader(s.parse)
    elif s.type is Path:
        kw["type"] = _path
    elif s.type in (int, float):
        kw["type"] = s.type
    if s.choices is not None and s.listed:
        kw["choices"] = [*s.choices, *(c for o in sharers for c in cast(tuple, o.choices))]  # a sharer has choices
    if s.metavar is not None:
        kw["metavar"] = s.metavar
    if sharers:
        kw.update(action=_Shared, other=sharers[0])
    return kw


def build_parser(description: str) -> argparse.ArgumentParser:
    """The parser of every setting, in the parts' order; the text runs' and the model-parallel settings in sections
    of their own."""
    parser = _Parser(description=description)
    sections: dict[str | None, argparse._ActionsContainer] = {
        None: parser,
        **{g: parser.add_argument_group(title) for g, title in GROUPS.items()},
    }
    for _, s in SETTINGS.values():
        sharers = [o for _, o in SETTINGS.values() if o.shares == s.key]
        sections[s.group].add_argument(s.flag, **_option(s, sharers))
    return parser


def config_from(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of a parse's namespace: the flags given, the declared defaults for the rest.  With --resume
    and no --model, the checkpoint's model decides which flags apply: a checkpoint that cannot be read is refused
    for what it is (truncated, damaged, missing) before any flag is checked against it."""
    given = vars(args)
    settings = dict(given)
    if "resume" in given and "model" not in given:
        from ..storage.checkpoint import saved_model

        settings["model"] = saved_model(given["resume"])
    return TrainConfig(**settings, given=frozenset(given))
