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

LOCK_FILE = ".lock"


@contextlib.contextmanager
def run_lock(run_dir: str | Path) -> Iterator[None]:
    """Hold the run directory's lock (creating the directory) for the ``with`` block.

    Raises:
      RunLockedError: another process holds it; names that process's pid.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise RunLockedError(
                f"run directory '{run_dir}' is in use by another run (pid {holder}); fix: wait for it to "
                f"finish or choose another --run-name"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def is_locked(run_dir: str | Path) -> bool:
    """True if another process holds ``run_dir``'s lock right now."""
    path = Path(run_dir) / LOCK_FILE
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
