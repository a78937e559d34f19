"""An exclusive, advisory lock on a run directory (``<run>/.lock``, :mod:`ensemble_core.filelock`).

The kernel releases the lock when its holder exits, even on SIGKILL, so a crashed run
never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from ensemble_core.errors import RunLockedError
from ensemble_core.filelock import LockHeldError, flocked
from ensemble_core.runs.layout import RunDir


@contextlib.contextmanager
def run_lock(run_dir: str | Path) -> Iterator[None]:
    """Hold the run directory's lock (creating the directory) for the ``with`` block; the
    lock file holds the holder's pid.

    Raises:
      RunLockedError: another process holds it; names that process's pid.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        try:
            fd = stack.enter_context(flocked(RunDir(run_dir).lock, blocking=False))
        except LockHeldError as held:
            raise _refusal(run_dir, held.holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield


def _refusal(run_dir: Path, holder: str) -> RunLockedError:
    return RunLockedError(
        f"run directory '{run_dir}' is in use by another run (pid {holder or 'unknown'}); fix: wait for it to "
        f"finish or choose another run_name"
    )


def ensure_unlocked(run_dir: str | Path) -> None:
    """Check, without taking it or creating anything, that no process holds ``run_dir``'s lock.

    Raises:
      RunLockedError: another process holds it (the same error :func:`run_lock` raises).
    """
    path = RunDir(Path(run_dir)).lock
    if not path.exists():
        return
    try:
        with flocked(path, shared=True, blocking=False, create=False):
            pass
    except LockHeldError as held:
        raise _refusal(Path(run_dir), held.holder) from None
