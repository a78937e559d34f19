"""Advisory file locks (``flock(2)``), the one primitive behind the run directory's lock,
the champion state's lock and the dataset preparation lock.

``flock`` locks belong to the open file description: the kernel releases them when the
holder exits, even on SIGKILL, so a crashed process never leaves a stale lock, and two
opens in one process conflict like two processes (the tests rely on that). Not a
library's lock: ``fasteners`` takes POSIX record locks (``lockf``), which never conflict
within one process and are dropped when *any* descriptor of the file is closed, and
``filelock`` truncates the lock file on every attempt, which would erase the holder's pid
that the run lock's refusal names.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


class LockHeldError(BlockingIOError):
    """A non-blocking :func:`flocked` found the lock held; ``holder`` is the lock file's
    text (the run lock writes its holder's pid there), empty if none."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is locked by {holder or 'another process'}")
        self.path = path
        self.holder = holder


@contextlib.contextmanager
def flocked(path: str | Path, *, shared: bool = False, blocking: bool = True, create: bool = True) -> Iterator[int]:
    """Hold a ``flock`` on ``path`` for the ``with`` block; yields the open descriptor
    (read-write, or read-only with ``create=False``).

    Args:
      path: the lock file; created (mode 0o644, empty) when ``create`` and missing.
      shared: a shared (``LOCK_SH``) instead of an exclusive (``LOCK_EX``) lock.
      blocking: wait for the lock; otherwise raise at once.

    Raises:
      LockHeldError: ``blocking=False`` and another open file holds a conflicting lock.
      OSError: the file cannot be opened (``FileNotFoundError`` with ``create=False``).
    """
    path = Path(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT if create else os.O_RDONLY, 0o644)
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise LockHeldError(path, holder) from None
        yield fd
    finally:
        os.close(fd)  # releases the lock
