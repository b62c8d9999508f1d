"""Train a hand-written model beside its nn.Module twin, from the same weights and batches.

    python train.py                                # the MLP on Fashion-MNIST (Debian's package or ./data)
    python train.py --dataset mnist                # MNIST under ./data, downloaded by torchvision if missing
    python train.py --impl manual --epochs 2 --hidden 128 --device cuda
    python train.py --dataset shakespeare --model gpt   # a character GPT on the shipped Shakespeare corpus

Each implementation trains on the same batches in the same order; the run reports per
epoch their losses, accuracies and seconds, and at the end how far their weights drifted
apart.  Outputs go to --out (default runs/<timestamp>-<pid>): metrics.jsonl, summary.json, PNG
plots and checkpoint.pt (written atomically after every epoch; --resume continues from it).

This file is the command line only: flags -> training.TrainConfig (its flags derived from the settings'
declarations, training/config/command_line.py) -> training.run.
"""

from __future__ import annotations

import argparse
import os
import sys

try:  # importing torch takes seconds: Ctrl-C then is an interruption like any other, not a traceback
    from training import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, Interrupted, RunFailed, TrainConfig, UsageError, run
    from training.config.command_line import build_parser as _settings_parser
    from training.config.command_line import config_from
except KeyboardInterrupt:
    print("\ninterrupted", file=sys.stderr)
    sys.exit(130)


def build_parser() -> argparse.ArgumentParser:
    """train.py's flags: one for each setting, as its part in training/config/ declares it, and --sanity."""
    p = _settings_parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--sanity",
        action="store_true",
        default=argparse.SUPPRESS,
        help="run the pre-flight checks "
        "(initial loss, overfitting 20 examples, gradients vs autograd, manual vs twin) and exit 0 only if "
        "all pass",
    )
    return p


def parse(argv: list[str] | None) -> tuple[TrainConfig, bool]:
    """Flags -> (TrainConfig, whether --sanity was given); ``config.given`` names the settings given."""
    args = build_parser().parse_args(argv)
    sanity = vars(args).pop("sanity", False)
    return config_from(args), sanity


def parse_config(argv: list[str] | None) -> TrainConfig:
    return parse(argv)[0]


def main(argv: list[str] | None = None) -> int:
    """train.py with ``argv``; -> its exit status.  Ctrl-C is a KeyboardInterrupt here, after one line on stderr."""
    try:
        config, sanity = parse(argv)
        if sanity:
            from training.sanity import run_sanity

            return run_sanity(config)
        return run(config)
    except Interrupted:  # the run said where its last checkpoint is
        raise
    except KeyboardInterrupt:  # before training started (loading data, say): nothing was written
        print("\ninterrupted", file=sys.stderr)
        raise
    except (UsageError, RunFailed) as e:
        msg = str(e)
        print(msg if msg.startswith("error:") else f"train.py: error: {msg}", file=sys.stderr)
        return EXIT_USAGE if isinstance(e, UsageError) else EXIT_FAILED


def _leave(code: int) -> None:
    """Exit with ``code``.  A rank under torchrun leaves without the interpreter's teardown: after a run that
    stopped early (ranks that disagree, a failed peer) torch's process-group threads can abort that teardown
    ("terminate called without an active exception", exit -6 instead of the run's status, measured about once
    in three runs of tests/test_distributed_faults.py).  Every file the run wrote is closed by then (checkpoints
    and logs fsynced); only the standard streams are flushed here."""
    if os.environ.get("WORLD_SIZE") is None:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cli(argv: list[str] | None = None) -> int:
    """main() as the command line runs it: Ctrl-C, a KeyboardInterrupt for in-process callers, is exit 130."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    _leave(cli())
