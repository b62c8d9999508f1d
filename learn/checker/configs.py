"""The configurations an exercise is checked on: its default, the ones that expose what one setting hides (N = 1,
odd and non-square sizes, every padding, large logits, ties), and a seeded random draw of shapes.

A configuration is the spec with some of its fields replaced (``ctor``, ``params``, ``inputs``, ``numeric``):
``expand(spec)`` lists them, the default first, each with its label for the report.  The same list is built in the
checker's process and in the learner's, so a configuration travels between them as its number.
"""
from __future__ import annotations

import dataclasses

import torch

from .spec import LayerSpec

RANDOM_SEED = 1234


_BUILT: dict[int, tuple] = {}  # id(spec) -> (spec, its configurations): the spec kept, so its id stays its own


def _build(spec: LayerSpec) -> tuple:
    out = [(spec.label, spec)]
    for k, over in enumerate(spec.configs):
        over = dict(over)
        label = over.pop("label")
        out.append((label, dataclasses.replace(spec, label=label, seed=spec.seed + 1 + k, **over)))
    if spec.random is not None:
        over = spec.random(torch.Generator().manual_seed(RANDOM_SEED))
        label = "random shapes (seeded): " + over.pop("label", "")
        out.append((label, dataclasses.replace(spec, label=label, seed=RANDOM_SEED, **over)))
    return tuple(out)


def expand(spec: LayerSpec) -> tuple[tuple[str, LayerSpec], ...]:
    """(label, the spec of that configuration) for each configuration of ``spec``, the default first."""
    if id(spec) not in _BUILT:
        _BUILT[id(spec)] = (spec, _build(spec))
    return _BUILT[id(spec)][1]
