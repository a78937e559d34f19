"""An exclusive, advisory lock on a run directory (``<run>/.lock``, ``fcntl.flock``).

The kernel releases the lock when its holder exits, even on SIGKILL, so a crashed run
never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ensemble_core.errors import RunLockedError
from ensemble_core.runs.layout import RunDir


@contextlib.contextmanager
def run_lock(run_dir: str | Path) -> Iterator[None]:
    """Hold the run directory's lock (creating the directory) for the ``with`` block.

    Raises:
      RunLockedError: another process holds it; names that process's pid.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(RunDir(run_dir).lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _refusal(run_dir, fd) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _refusal(run_dir: Path, fd: int) -> RunLockedError:
    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    return RunLockedError(
        f"run directory '{run_dir}' is in use by another run (pid {holder}); fix: wait for it to "
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
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _refusal(Path(run_dir), fd) from None
    finally:
        os.close(fd)
