"""Data snapshots: a dataset prepared from one exact state of its source.

The source is fingerprinted before anything is read (:func:`fingerprint_source`), and the
dataset is prepared into a directory keyed by that fingerprint::

    <TFDS data dir>/snapshots/<name>/<fingerprint>/     the snapshot's TFDS data dir
        <name>/<version>/                                the prepared array_record files
        snapshot.json                                    the lineage record (DataSnapshot)
        .last-used                                       mtime: when a run last prepared or reused it

so a changed source is prepared anew and an unchanged one is reused (also by concurrent
runs: preparation holds ``<TFDS data dir>/.<name>.prepare.lock``, as does removal).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The directory under a TFDS data dir that holds every snapshot: ``snapshots/<name>/<fingerprint>/``.
SNAPSHOTS = "snapshots"
#: The lineage record in a snapshot directory.
SNAPSHOT_FILE = "snapshot.json"
#: Touched whenever a run prepares or reuses the snapshot (its mtime is the last use).
LAST_USED = ".last-used"


def prepare_lock_path(root: str | Path, name: str) -> Path:
    """The lock preparing (and removing) snapshots of dataset ``name`` under the TFDS data
    dir ``root`` holds: ``<root>/.<name>.prepare.lock``."""
    return Path(root) / f".{name}.prepare.lock"


def mark_used(snapshot_dir: str | Path) -> None:
    """Record that a run uses ``snapshot_dir`` now (touch :data:`LAST_USED`)."""
    path = Path(snapshot_dir) / LAST_USED
    path.touch()
    os.utime(path)


def last_used(snapshot_dir: str | Path) -> float:
    """When a run last prepared or reused ``snapshot_dir`` (seconds since the epoch; the
    directory's own mtime when it was never marked)."""
    path = Path(snapshot_dir) / LAST_USED
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return Path(snapshot_dir).stat().st_mtime
