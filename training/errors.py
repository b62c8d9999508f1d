"""What a training run can end with: its exit statuses and the errors the command line reports in one line."""

from __future__ import annotations

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """Bad arguments, missing data or an unusable path: the command prints the one-line message, exit 2."""


class RunFailed(Exception):
    """The run started and could not go on (a full disk, a failed peer process): one line, exit 1; the last
    complete checkpoint is kept."""


class NonFiniteLoss(Exception):
    """The training loss became inf or nan: the run stops, exit 1, keeping the last complete checkpoint."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run, raised after the run said where its last complete checkpoint is; a KeyboardInterrupt,
    so that a program calling the run in-process (a test suite) stops too.  The command line exits 130."""
