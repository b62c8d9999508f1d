"""python -m learn train NAME FILE: your code trains beside a trusted twin, from the same weights on the same batches.

The layer and loss exercises (NETWORKS) train a small image network (``learn/train_layers.py``);
``learn/train_text.py`` trains a character model on Shakespeare for embedding, lstm_cell and attention,
``learn/train_optim.py`` an MLP with your Adam, ``learn/train_value.py`` micrograd's two-moons MLP of your Values,
``learn/train_parallel.py`` linear_split and tensor_parallel, ``learn/train_blocks.py`` ring_attention and
moe_dispatch (inside a small torch model).  Everything is float64: with a right answer the losses
agree to round-off at every step; a wrong forward parts them at step 1, a wrong gradient at step 2 (the first
update differs).  Exit 0 when they agree to ``race.TOL`` at every step, 1 when they part (or your code raises), 2
when the file cannot be used.
"""

from __future__ import annotations

from pathlib import Path

from .checker.guard import LearnerFailed
from .checker.load import LoadError, load_class
from .exercises import BY_NAME
from .race import run
from .train_layers import NETWORKS, layer_race
from .train_more import RACES

__all__ = ["main", "NETWORKS", "RACES"]


def main(args) -> int:
    ex = BY_NAME.get(args.name)
    if ex is None:
        print(f"python -m learn train: no exercise called {args.name!r}; the exercises are {', '.join(BY_NAME)}")
        return 2
    if args.steps < 1:
        print(f"--steps must be at least 1, got {args.steps}")
        return 2
    try:
        cls = load_class(Path(args.file), ex.cls, ex.name)
    except LoadError as e:
        print(f"Cannot train {args.file}: {e}")
        return 2
    try:
        race = (layer_race if ex.name in NETWORKS else RACES[ex.name])(ex, cls, args.file, args.seed)
    except LearnerFailed as e:
        print(e.text)
        return 1
    return run(race, ex, args.file, args.steps, args.plot)
