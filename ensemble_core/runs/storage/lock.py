"""An exclusive, advisory lock on a run directory (``<run>/.lock``, :mod:`ensemble_core.filelock`).

The kernel releases the lock when its holder exits, even on SIGKILL, so a crashed run
never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from ensemble_core.errors import RunLockedError
from ensemble_core.filelock import LockHeldError, flocked
from ensemble_core.runs.storage.layout import RunDir


@contextlib.contextmanager
def run_lock(run_dir: str | Path, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the run directory's lock (creating the directory) for the ``with`` block; the
    lock file holds the holder's pid.

    Args:
      wait_s: seconds to wait for a lock another process holds before refusing (0: refuse
        at once). A member group's task run again on another host waits for the trainer
        of the host that lost the cluster to stop and let go (docs/distributed.md).

    Raises:
      RunLockedError: another process holds it (still, after ``wait_s``); names that
        process's pid.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    with contextlib.ExitStack() as stack:
        while True:
            try:
                fd = stack.enter_context(flocked(RunDir(run_dir).lock, blocking=False))
                break
            except LockHeldError as held:
                if time.monotonic() >= deadline:
                    raise _refusal(run_dir, held.holder, wait_s) from None
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield


def _refusal(run_dir: Path, holder: str, waited_s: float = 0.0) -> RunLockedError:
    waited = f", still after {waited_s:.0f} s" if waited_s else ""
    return RunLockedError(
        f"run directory '{run_dir}' is in use by another run (pid {holder or 'unknown'}{waited})",
        fix="wait for it to finish or choose another run_name",
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
