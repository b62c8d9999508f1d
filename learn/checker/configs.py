"""The configurations an exercise is checked on: its default, the ones that expose what one setting hides (N = 1,
odd and non-square sizes, every padding, large logits, ties), and a seeded random draw of shapes.

A configuration is the spec with some of its fields replaced (``ctor``, ``params``, ``inputs``, ``numeric``):
``expand(spec)`` lists them, the default first, each with its label for the report.  The same list is built in the
checker's process and in the learner's, so a configuration travels between them as its number.

``variant(seed)`` (a grader's per-student variation): within it every configuration's seed, and the random
draw of shapes, come from ``seed``, so an answer that hard-codes the numbers of one run fails another.  The
learner's process is forked inside it and so builds the same configurations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib

import torch

from .spec import LayerSpec

RANDOM_SEED = 1234


_BUILT: dict[tuple, tuple] = {}  # (id(spec), variant) -> (spec, its configurations): the spec kept, so its id
_VARIANT: list[int | None] = [None]  # stays its own; the variant in force (None: the fixed seeds)


def stable_seed(text: str) -> int:
    """A seed from ``text`` that is the same in every process and run (Python's ``hash`` of a str is salted)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big") & 0x7FFFFFFF


@contextlib.contextmanager
def variant(seed: int | None):
    """Within it, the configurations are drawn from ``seed`` (None: the fixed ones)."""
    before, _VARIANT[0] = _VARIANT[0], seed
    try:
        yield
    finally:
        _VARIANT[0] = before


def current() -> int | None:
    """The variant's seed in force, or None."""
    return _VARIANT[0]


def _build(spec: LayerSpec, v: int | None) -> tuple:
    def seed(k: int) -> int:  # configuration k's seed: fixed, or drawn from the variant
        return (spec.seed + k if k else spec.seed) if v is None else stable_seed(f"{v}:{k}")

    first = spec if v is None else dataclasses.replace(spec, seed=seed(0))
    out = [(spec.label, first)]
    for k, over in enumerate(spec.configs):
        over = dict(over)
        label = over.pop("label")
        out.append((label, dataclasses.replace(spec, label=label, seed=seed(1 + k), **over)))
    if spec.random is not None:
        drawn = RANDOM_SEED if v is None else stable_seed(f"{v}:random")
        over = spec.random(torch.Generator().manual_seed(drawn))
        label = "random shapes (seeded): " + over.pop("label", "")
        out.append((label, dataclasses.replace(spec, label=label, seed=drawn, **over)))
    return tuple(out)


def expand(spec: LayerSpec) -> tuple[tuple[str, LayerSpec], ...]:
    """(label, the spec of that configuration) for each configuration of ``spec``, the default first."""
    key = (id(spec), _VARIANT[0])
    if key not in _BUILT:
        _BUILT[key] = (spec, _build(spec, _VARIANT[0]))
    return _BUILT[key][1]
