"""Atomic file writes: a synced temporary file in the same directory, then ``os.replace``,
so a reader sees the old file or the new one, never a half-written one, whatever kills
the writer. The one implementation for the run layer (:mod:`ensemble_core.runs.storage.layout`
re-exports it) and the data layer (lineage records, the source-hash cache, IDX exports).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Write ``path`` through ``write(file)`` on a synced temporary file in the same
    directory (``.<name>.<random>.tmp``), then ``os.replace``; the temporary file is
    removed if anything fails. Creates the parent directory. The file gets the
    permissions ``open()`` would give it (0666 less the umask).

    Raises:
      OSError: the directory cannot be written (read-only, full, missing permissions);
        its ``filename`` is ``path`` when the failing call named no file (a ``write()``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would create it (mkstemp makes 0600)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename is None:  # a write() that failed: name the file
            err.filename = str(path)
        raise


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once, at import (os.umask can only be read by setting it, which would race with
# threads creating files, e.g. orbax's checkpoint writers).
_UMASK = _read_umask()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """:func:`atomic_write` of ``data``."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write` of ``text`` (UTF-8)."""
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    """:func:`atomic_write` of ``obj`` as indented JSON plus a newline."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def atomic_savez(path: Path, **arrays: np.ndarray) -> None:
    """:func:`atomic_write` of ``np.savez`` (uncompressed ``.npz``) of ``arrays``."""
    atomic_write(path, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]  # numpy stubs: a **dict may hold allow_pickle
