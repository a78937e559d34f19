"""Arrays derived from a prepared dataset (transformed test sets, rendered OOD sets),
built once and cached beside the dataset, within a disk cap.

The cap (``eval.derived_cache_mb``, default 512 MiB) bounds the ``.npz`` files of one
dataset's derived directory (:func:`derived_dir`: one data snapshot, or one TFDS dataset
version): before a new set is written, the least recently used ones (by modification time,
which a read refreshes) are removed until it fits; a set larger than the cap is used but not
kept. The default protocol's sets stay below it (8 MB for an image folder of 300 28x28 test
images, measured; about 80 MB for 10,000 such images, 300 MB for 10,000 32x32 RGB ones:
docs/evaluation.md); ``eval.protocol: full`` on a large test split is what reaches it."""

from __future__ import annotations

import contextlib
import logging
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ensemble_core.atomic import atomic_savez
from ensemble_core.data import DatasetInfo

log = logging.getLogger(__name__)


def derived_dir(dataset: DatasetInfo) -> Path:
    """Where arrays derived from a prepared dataset are cached (transformed test sets,
    rendered OOD sets): ``<TFDS data dir>/ensemble-derived/<dataset>/<version>/``, and for a
    run on a subset of its classes (``data.classes``) its own ``classes-<i>-<j>-...``
    below it: a subset's test split is other images under the same image count."""
    variant = Path(dataset.data_dir)  # <root>/<name>/<version>
    root = variant.parents[1] / "ensemble-derived" / variant.parent.name / variant.name
    if dataset.class_indices is None:
        return root
    return root / ("classes-" + "-".join(str(i) for i in dataset.class_indices))


MIB = 2**20


def disk_use(directory: Path) -> int:
    """Bytes of the cached sets (``*.npz``) directly in ``directory`` (0 when it does not exist)."""
    total = 0
    for path in directory.glob("*.npz"):
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile by another run's eviction
            total += path.stat().st_size
    return total


def make_room(directory: Path, needed: int, cap_bytes: int, keep: Path) -> list[Path]:
    """Remove the least recently used ``*.npz`` of ``directory`` (oldest modification time
    first; never ``keep``) until its sets and ``needed`` more bytes fit in ``cap_bytes``.
    Returns the files removed."""
    files = []
    for path in directory.glob("*.npz"):
        with contextlib.suppress(FileNotFoundError):
            stat = path.stat()
            files.append((stat.st_mtime, stat.st_size, path))
    used = sum(size for _, size, _ in files)
    removed = []
    for _, size, path in sorted(files):
        if used + needed <= cap_bytes:
            break
        if path == keep:
            continue
        path.unlink(missing_ok=True)
        used -= size
        removed.append(path)
    return removed


def cached_arrays(
    dataset: DatasetInfo,
    key: str,
    build: Callable[[], dict[str, np.ndarray]],
    shapes: dict[str, tuple[int, ...]] | None = None,
    cap_bytes: int | None = None,
) -> dict[str, np.ndarray]:
    """``build()``'s arrays, read from ``derived_dir(dataset)/<key>.npz`` when present
    (written atomically the first time). A cache file that cannot be read, or whose
    arrays are not the ``shapes`` given (``{name: shape}``; e.g. a readable file with the
    wrong number of rows), is built again, with one warning.

    With ``cap_bytes`` (``eval.derived_cache_mb``), the directory's sets stay within it: a
    read marks the file used (its modification time), a new set first makes room
    (:func:`make_room`, least recently used first, logged) and a set larger than the cap is
    not written (logged). Every write is logged with its size and the directory's total.

    Raises:
      ValueError: ``key`` is not a plain file name.
    """
    if not key or "/" in key or key.startswith("."):
        raise ValueError(f"cache key {key!r} is not a plain file name")
    path = derived_dir(dataset) / f"{key}.npz"
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        wrong = [
            f"{name} {arrays[name].shape if name in arrays else 'missing'} instead of {shape}"
            for name, shape in (shapes or {}).items()
            if name not in arrays or tuple(arrays[name].shape) != tuple(shape)
        ]
        if not wrong:
            if cap_bytes is not None:
                with contextlib.suppress(OSError):  # least recently used goes first: this one was used now
                    os.utime(path)
            return arrays
        log.warning("cached %s holds %s; building it again", path, ", ".join(wrong))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        log.warning("cached %s is unreadable (%s); building it again", path, err)
    arrays = build()
    size = sum(a.nbytes for a in arrays.values())  # an uncompressed .npz: the arrays and ~0.3 KB of headers each
    if cap_bytes is not None and size > cap_bytes:
        log.warning(
            "derived set %s (%.1f MB) is larger than eval.derived_cache_mb (%.0f MB): used, not kept",
            key,
            size / MIB,
            cap_bytes / MIB,
        )
        path.unlink(missing_ok=True)
        return arrays
    removed = make_room(path.parent, size, cap_bytes, path) if cap_bytes is not None else []
    atomic_savez(path, **arrays)
    log.info(
        "derived set %s: %.1f MB written; %s holds %.1f MB of derived sets%s%s",
        key,
        path.stat().st_size / MIB,
        path.parent,
        disk_use(path.parent) / MIB,
        "" if cap_bytes is None else f" (cap eval.derived_cache_mb {cap_bytes / MIB:.0f} MB)",
        f", {len(removed)} least recently used removed to fit" if removed else "",
    )
    return arrays
