"""Errors raised by ensemble_core: each says what was wrong and how to fix it.

Every error derives from :class:`EnsembleError`, so the CLI can turn any of them into a
one-line message and exit code 2 before anything is computed or written.
"""

from __future__ import annotations


class EnsembleError(Exception):
    """Base class of every error the project raises on purpose.

    Args:
        problem: what is wrong, naming the value, file or process.
        fix: what the user does about it; the message is ``"<problem>; fix: <fix>"``.

    Attributes:
        problem, fix: as given (a caller that adds context keeps the fix or replaces it).
    """

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(problem if fix is None else f"{problem}; fix: {fix}")
        self.problem, self.fix = problem, fix


def resume_fix(run_name: str) -> str:
    """The fix of every stop that leaves a run to resume: its name, to run it again."""
    return f"rerun with the same run name (run_name {run_name}) to resume"


class ConfigError(EnsembleError, ValueError):
    """A configuration value is missing, unknown or out of range."""


class DataError(EnsembleError):
    """A dataset cannot be found, prepared or read."""


class MeshError(EnsembleError, ValueError):
    """The requested device mesh cannot be built on the devices present."""


class CheckpointError(EnsembleError):
    """A checkpoint cannot be written or restored (or does not fit the config)."""


class RunLockedError(EnsembleError):
    """Another process is using the run directory."""


class PreemptedError(EnsembleError):
    """Training was asked to stop (SIGTERM); a checkpoint was saved at the step boundary."""


class DivergenceError(EnsembleError):
    """A member diverged and the config says to fail the run."""


class IncompatibleRunError(ConfigError):
    """The run directory holds checkpoints of a different model, dataset, seed or E."""


class OutputError(EnsembleError):
    """A file of the run cannot be written where it belongs: a read-only file system, or
    one that accepts directories but no files (``/proc``, ``/sys``, ...)."""


class DiskFullError(OutputError):
    """No space left (``ENOSPC``) or the disk quota used up (``EDQUOT``) where the run
    writes; the message names the path, the free space and the fix."""
