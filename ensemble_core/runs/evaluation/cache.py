"""Arrays derived from a prepared dataset (transformed test sets, rendered OOD sets),
built once and cached beside the dataset."""

from __future__ import annotations

import logging
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


def cached_arrays(
    dataset: DatasetInfo,
    key: str,
    build: Callable[[], dict[str, np.ndarray]],
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> dict[str, np.ndarray]:
    """``build()``'s arrays, read from ``derived_dir(dataset)/<key>.npz`` when present
    (written atomically the first time). A cache file that cannot be read, or whose
    arrays are not the ``shapes`` given (``{name: shape}``; e.g. a readable file with the
    wrong number of rows), is built again, with one warning.

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
            return arrays
        log.warning("cached %s holds %s; building it again", path, ", ".join(wrong))
    except FileNotFoundError:
        pass
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        log.warning("cached %s is unreadable (%s); building it again", path, err)
    arrays = build()
    atomic_savez(path, **arrays)
    return arrays
