"""Special files (FIFOs, devices, sockets) named where a regular file is expected.

Opening a FIFO for reading blocks until a writer appears, a character device such as
``/dev/zero`` or ``/dev/urandom`` reads without end, a socket cannot be opened at all:
a config, an image array or a data file that is one of them is refused by its type,
before it is opened (issue 43, class 2).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["special_kind"]

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def special_kind(path: str | Path) -> str | None:
    """What ``path`` is if it is a special file (``"a FIFO (named pipe)"``, ``"a character
    device"``, ``"a block device"``, ``"a socket"``), following symlinks; None for a regular
    file, a directory, or a path that does not exist or cannot be examined (the caller's own
    open reports those)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), None)
