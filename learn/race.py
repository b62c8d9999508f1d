"""Two trainings side by side: the learner's code and a trusted twin, the same weights and batches, step by step.

A ``Race`` holds one step of each (each returns its loss, computed before its update); ``run`` takes the
steps, prints the losses in columns, and reports the first step where the learner's loss leaves the twins'
by more than TOL (relative): exit 0 when they never part, 1 when they do or the learner's code raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .checker.guard import LearnerFailed
from .files import check_command

TOL = 1e-6  # relative difference of the losses that counts as parting (a right answer: ~1e-15)
LEARNING_IS_NO_CHECK = (
    "Your loss still falls?  Your wrong gradient still trains: a falling loss is no gradient "
    "check (a gradient\nthat points roughly downhill lowers the loss too); only the comparison "
    "with the right one says it is right."
)


@dataclass
class Race:
    what: list[str]  # what is trained, on what, how: printed first
    mine: Callable[[int], float]  # one step with the learner's code (it raises LearnerFailed) -> the loss
    twins: dict[str, Callable[[int], float]]  # column name -> one step of a trusted twin -> its loss
    first_part: str = "the forward differs (both start from the same weights)"  # what parting at step 1 means
    later_part: str = (
        "the first steps agree, so the forward is right; the update after them differed: a gradient is wrong"
    )
    still_learns: str = LEARNING_IS_NO_CHECK  # said when the learner's loss fell although it parted


def run(race: Race, ex, file: str, steps: int, plot: str | None) -> int:
    """Train ``steps`` steps, print the table and the verdict -> 0 agree, 1 part."""
    for line in race.what:
        print(line)
    names = list(race.twins)
    print(f"{'step':>6} {'your loss':>14} " + " ".join(f"{n:>14}" for n in names) + f" {'difference':>11}")
    ours, theirs, parted = [], {n: [] for n in names}, None
    for step in range(1, steps + 1):
        try:
            a = race.mine(step)
        except LearnerFailed as e:
            print(e.text)
            print(
                f"PART at step {step}: your code raised.  {check_command(ex.name, file)} tries it on "
                f"small inputs and says more."
            )
            return 1
        bs = [race.twins[n](step) for n in names]
        ours.append(a)
        for n, b in zip(names, bs, strict=True):
            theirs[n].append(b)
        diff = max(abs(a - b) for b in bs) if math.isfinite(a) else float("inf")
        if parted is None and diff > TOL * max(1.0, *(abs(b) for b in bs)):
            parted = step
        if steps <= 50 or step % 10 == 0 or step in (parted, steps):
            print(
                f"{step:>6} {a:>14.8f} "
                + " ".join(f"{b:>14.8f}" for b in bs)
                + f" {diff:>11.1e}"
                + ("   <- they part" if step == parted else "")
            )
        if not math.isfinite(a):
            print("your loss is no longer finite: stopping")
            break
    if plot:
        _plot(Path(plot), ours, theirs, parted, ex)
    if parted is None:
        worst = max(abs(a - b) for n in names for a, b in zip(ours, theirs[n], strict=True))
        print(
            f"AGREE: {len(ours)} steps, the losses never more than {worst:.1e} apart (tolerance {TOL:g} "
            f"relative): your {ex.cls} trains as {' and '.join(names)} {'do' if len(names) > 1 else 'does'}."
        )
        return 0
    print(
        f"PART at step {parted}: {race.first_part if parted == 1 else race.later_part}.  "
        f"{check_command(ex.name, file)} names the tensor and, most often, the mistake."
    )
    if len(ours) > 1 and ours[-1] < ours[0]:
        print(race.still_learns)
    return 1


def _plot(path: Path, ours: list[float], theirs: dict[str, list[float]], parted: int | None, ex) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: matplotlib is not installed)")
        return
    fig, (ax, low) = plt.subplots(2, 1, figsize=(6.4, 5.2), sharex=True, height_ratios=(3, 2))
    steps = range(1, len(ours) + 1)
    for name, curve in theirs.items():
        ax.plot(steps, curve, lw=3, alpha=0.5, label=name)
    ax.plot(steps, ours, lw=1.2, ls="--", label=f"yours ({ex.cls})")
    first = next(iter(theirs.values()))
    low.semilogy(steps, [max(abs(a - b), 1e-18) for a, b in zip(ours, first, strict=True)], lw=1.2, color="black")
    low.axhline(TOL, color="gray", ls=":", lw=1, label=f"tolerance {TOL:g}")
    for a in (ax, low):
        if parted is not None:
            a.axvline(parted, color="red", lw=0.8, label=f"they part (step {parted})")
    ax.set_ylabel("training loss")
    low.set_ylabel("|difference|")
    low.set_xlabel("step")
    ax.set_title(f"learn train {ex.name}: yours beside {' and '.join(theirs)}")
    ax.legend()
    low.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")
