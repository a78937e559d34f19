"""How the command lines report a refused or failed run."""

from __future__ import annotations

import sys

from ensemble_core.errors import EnsembleError, PreemptedError

EXIT_BAD_INPUT = 2  # bad input or a failed stage: one line on stderr
EXIT_PREEMPTED = 75  # stopped by SIGTERM after a checkpoint; rerun to resume (EX_TEMPFAIL)


def report_error(err: EnsembleError) -> int:
    """Print ``error: <message>`` on stderr; returns the exit code for ``err``."""
    print(f"error: {err}", file=sys.stderr)
    return EXIT_PREEMPTED if isinstance(err, PreemptedError) else EXIT_BAD_INPUT
