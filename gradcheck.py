"""python gradcheck.py: check every built-in layer, loss and model's hand-written backward, twice -- against central
differences and against torch.autograd -- and print a table; ``--layer NAME`` checks one, ``--fast`` uses random
projections of the Jacobian.  Exit status 1 on any failure.

The library is the package ``checking`` (re-exported here: ``from gradcheck import check_layer`` checks a layer of
your own); the cases are ``checking.cases``'s families.
"""

from __future__ import annotations

import argparse
import sys

import torch

from checking import (
    EPS,
    PROJECTIONS,
    RTOL,
    GradResult,
    check_layer,
    check_loss,
    directional_derivative,
    numeric_grad,
    rel_error,
)
from checking.cases import FAMILIES, Case, Family, collect, distinct, layer_case, nontrivial, rnd

__all__ = [
    "check_layer",
    "check_loss",
    "GradResult",
    "rel_error",
    "numeric_grad",
    "directional_derivative",
    "EPS",
    "RTOL",
    "PROJECTIONS",
    "builtin_cases",
    "main",
    "rnd",
    "layer_case",
    "nontrivial",
    "distinct",
]

CASE_FAMILIES: list[Family] = list(FAMILIES)  # what the command runs (a test may swap in its own)


def builtin_cases() -> dict[str, list[Case]]:
    """Every built-in layer and loss, on several shapes (including N=1), in float64."""
    return collect(CASE_FAMILIES)


def main(argv: list[str] | None = None) -> int:
    cases = builtin_cases()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layer", metavar="NAME", help=f"check one of: {', '.join(cases)} (case-insensitive)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fast", action="store_true", help="random projections of the Jacobian instead of every entry")
    args = ap.parse_args(argv)
    if args.layer is not None and args.layer.lower() not in cases:
        ap.error(f"unknown layer {args.layer!r}; known: {', '.join(cases)}")
    selected = {k: v for k, v in cases.items() if args.layer is None or k == args.layer.lower()}
    results = []
    # The cases are tiny: one thread.  Convolution and pooling open a parallel region even for an 8x8 image,
    # and on a loaded machine a 2-thread region waits for a descheduled thread (docs/benchmarks.md).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for key, runs in selected.items():
            for i, run in enumerate(runs):
                torch.manual_seed(args.seed + 1000 * list(cases).index(key) + i)  # same inputs with or without --layer
                results += run(args.fast)
    finally:
        torch.set_num_threads(threads)

    w = max(len(r.name) for r in results)
    tw = max(len(r.tensor) for r in results)
    print(
        f"{'layer':<{w}}  {'tensor':<{tw}} {'max abs diff':>12} {'rel vs numeric':>14} {'rel vs autograd':>15}  result"
    )
    for r in results:
        auto = "opaque" if r.rel_autograd is None else f"{r.rel_autograd:.2e}"
        print(
            f"{r.name:<{w}}  {r.tensor:<{tw}} {r.max_abs_diff:>12.2e} {r.rel_numeric:>14.2e} {auto:>15}  "
            f"{'PASS' if r.passed else 'FAIL'}"
        )
    failed = [r for r in results if not r.passed]
    worst_num = max(results, key=lambda r: r.rel_numeric)
    worst_auto = max((r.rel_autograd or 0.0) for r in results)
    print(
        f"\n{len(results) - len(failed)} passed, {len(failed)} failed "
        f"(tolerance {RTOL:g}; worst relative error {worst_num.rel_numeric:.2e} vs numeric "
        f"[{worst_num.name} {worst_num.tensor}], {worst_auto:.2e} vs autograd)"
    )
    for r in failed:
        print("FAIL: " + r.describe(), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
