"""A run's subset of a dataset's classes (``data.classes``): which classes it keeps, its
view of the dataset, the kept classes' examples with their labels remapped, and the
held-out classes' test images.

The prepared dataset (its data snapshot and fingerprint) is never changed: one snapshot
serves every subset, and the subset is applied when a split is read. The kept classes
are the dataset's class indices in ascending order, so label ``k`` of the run is the
dataset's class ``class_indices[k]`` whatever order ``data.classes`` lists them in.

Order of filtering and capping: the split is filtered to the kept classes first, then
capped to its first ``limit`` examples in the split's order (``data.max_train_examples``,
``data.max_test_examples``): "K classes, at most N examples". The validation split is
carved from that, as without a subset. The held-out classes' test images are capped the
same way: the first ``limit`` test examples of the other classes.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import numpy as np

from ensemble_core.data.preparation import DatasetInfo, load_split
from ensemble_core.errors import ConfigError

#: At most this many class names are listed in a refusal (the rest are counted).
NAMES_SHOWN = 40


def known_classes(class_names: Sequence[str], num_classes: int) -> str:
    """The dataset's classes as a refusal lists them: ``0 'airplane', 1 'automobile', ...``."""
    names = list(class_names) or [str(i) for i in range(num_classes)]
    shown = ", ".join(f"{i} {n!r}" for i, n in enumerate(names[:NAMES_SHOWN]))
    return shown + (f", ... ({len(names)} in all)" if len(names) > NAMES_SHOWN else "")


def resolve_classes(
    classes: Sequence[int | str], class_names: Sequence[str], num_classes: int, dataset: str = "the dataset"
) -> tuple[int, ...]:
    """The dataset's class indices that ``classes`` (``data.classes``: indices and/or names
    of ``class_names``) lists, ascending. Names are compared in Unicode NFC, as class
    folders' names are stored: ``'été'`` typed in NFD names the class ``'été'``.

    Raises:
      ConfigError: one line (names escaped with ``repr``): a name with a control character
        (category Cc: newline, tab, ...; no class name holds one), an index outside
        ``0..num_classes-1``, a name that is not one of ``class_names`` (naming the known
        ones), a class listed twice (also as its index and its name, or as its name in
        NFC and in NFD), or fewer than two classes.
    """
    names = [unicodedata.normalize("NFC", n) for n in class_names] or [str(i) for i in range(num_classes)]
    seen: dict[int, int | str] = {}
    for entry in classes:
        if isinstance(entry, str):
            bad = [ch for ch in entry if unicodedata.category(ch) in ("Cc", "Zl", "Zp")]
            if bad:
                raise ConfigError(
                    f"data.classes: {entry!r} has the control character {bad[0]!r}, which no class name holds "
                    "(a class name is one line of the class map)",
                    fix=f"name classes of {dataset} (its classes: {known_classes(names, num_classes)})",
                )
            name = unicodedata.normalize("NFC", entry)  # a name typed in NFD (as macOS does) is the NFC class
            if name not in names:
                raise ConfigError(
                    f"data.classes: {dataset} has no class named {entry!r} (its classes: "
                    f"{known_classes(names, num_classes)})",
                    fix="name classes of the dataset, or give their indices",
                )
            index = names.index(name)
        else:
            index = int(entry)
            if not 0 <= index < num_classes:
                raise ConfigError(
                    f"data.classes: class index {index} is out of range: {dataset} has {num_classes} classes "
                    f"(0..{num_classes - 1})",
                    fix=f"give indices in 0..{num_classes - 1} or class names",
                )
        if index in seen:
            first = seen[index]
            twins = isinstance(first, str) and isinstance(entry, str) and first != entry
            shown = f"{first!a} and {entry!a}, one name in Unicode NFC" if twins else f"{first!r} and {entry!r}"
            raise ConfigError(
                f"data.classes lists class {index} ({names[index]!r}) twice, as {shown}",
                fix="list each class once",
            )
        seen[index] = entry
    if len(seen) < 2:
        raise ConfigError(
            f"data.classes keeps {len(seen)} class of {dataset}: a classifier needs two or more",
            fix="list two or more classes (or leave data.classes out to train on every class)",
        )
    return tuple(sorted(seen))


def class_counts(info: DatasetInfo, split: str) -> np.ndarray:
    """Examples of each of the dataset's classes in ``split`` (``'train'`` or ``'test'``):
    from the data snapshot's lineage record, else counted from the split's labels."""
    snapshot = info.snapshot
    total = len(snapshot.class_names) if snapshot is not None and snapshot.class_names else None
    if snapshot is not None and split in snapshot.class_counts:
        counts = np.asarray(snapshot.class_counts[split], np.int64)
        if total is None or len(counts) == total:
            return counts
    _, labels = load_split(info.name, split, info.tfds_data_dir)
    return np.bincount(labels, minlength=total or 0).astype(np.int64)


def full_class_names(info: DatasetInfo) -> tuple[str, ...]:
    """The dataset's whole class map (a subset's view keeps its snapshot's)."""
    if info.class_indices is None:
        return tuple(info.class_names)
    if info.snapshot is not None and info.snapshot.class_names:
        return tuple(info.snapshot.class_names)
    return ()


def subset_view(info: DatasetInfo, classes: Sequence[int | str] | None) -> DatasetInfo:
    """``info`` as a run that trains on ``classes`` (``data.classes``) sees it:
    ``num_classes`` K, the kept ``class_names``, ``num_train``/``num_test`` the kept
    classes' examples in each split, ``class_indices`` the kept classes' indices in the
    dataset; the snapshot and the files are the dataset's. ``info`` itself when
    ``classes`` is None or ``info`` is already a subset's view.

    Raises:
      ConfigError: see :func:`resolve_classes`.
    """
    if classes is None or info.class_indices is not None:
        return info
    kept = resolve_classes(classes, info.class_names, info.num_classes, f"dataset '{info.name}'")
    names = list(info.class_names) or [str(i) for i in range(info.num_classes)]
    train, test = (class_counts(info, split) for split in ("train", "test"))
    return info.model_copy(
        update={
            "num_classes": len(kept),
            "class_names": tuple(names[i] for i in kept),
            "num_train": int(sum(train[i] for i in kept if i < len(train))),
            "num_test": int(sum(test[i] for i in kept if i < len(test))),
            "class_indices": kept,
        }
    )


def keep_classes(
    images: np.ndarray, labels: np.ndarray, class_indices: Sequence[int], limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The examples of ``class_indices`` (ascending), the first ``limit`` of them in order,
    with labels remapped to ``0..K-1`` (class ``class_indices[k]`` -> ``k``): int32."""
    kept = np.asarray(class_indices, np.int64)
    idx = np.flatnonzero(np.isin(labels, kept))[:limit]
    return images[idx], np.searchsorted(kept, labels[idx]).astype(np.int32)


def held_out(
    images: np.ndarray, labels: np.ndarray, class_indices: Sequence[int], limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The examples of every class *not* in ``class_indices``, the first ``limit`` of them
    in order, with their labels in the dataset (int32)."""
    idx = np.flatnonzero(~np.isin(labels, np.asarray(class_indices, np.int64)))[:limit]
    return images[idx], labels[idx].astype(np.int32)


def load_held_out(
    name: str, data_dir: str | None, class_indices: Sequence[int], limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The held-out classes' test images: uint8 ``[M, H, W, C]`` and their labels in the
    dataset, int32 ``[M]`` -- every test example of a class not in ``class_indices``, the
    first ``limit`` of them (``data.max_test_examples``, applied as to the kept classes).

    Raises:
      DataError: see :func:`ensemble_core.data.load_split`.
    """
    images, labels = load_split(name, "test", data_dir)
    return held_out(images, labels, class_indices, limit)
