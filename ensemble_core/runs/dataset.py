"""The run's dataset: the config's data section applied to :mod:`ensemble_core.data` (the
dataset prepared, the subset of its classes ``data.classes`` applied, a split loaded)."""

from __future__ import annotations

import contextlib
import hashlib

import numpy as np

from ensemble_core import data as data_lib
from ensemble_core import diskspace
from ensemble_core.config import DataConfig, PipelineConfig
from ensemble_core.data import DatasetInfo, UserSource
from ensemble_core.errors import DataError
from ensemble_core.output_capture import captured_output


def _data_dir(data_cfg: DataConfig) -> str:
    return str(data_lib.tfds_root(data_cfg.name, data_cfg.data_dir))


def user_source(data_cfg: DataConfig) -> UserSource | None:
    """The image folder or arrays ``data_cfg`` names (None for ``data.source=tfds``)."""
    if data_cfg.source == "tfds" or data_cfg.path is None:
        return None
    return UserSource(
        kind=data_cfg.source,
        path=data_cfg.path,
        image_size=data_cfg.image_size,
        channels=data_cfg.channels,
        class_names=data_cfg.class_names,
        test_fraction=data_cfg.test_fraction,
        on_bad_image=data_cfg.on_bad_image,
    )


def fingerprint(data_cfg: DataConfig) -> str:
    """The fingerprint of what ``data_cfg``'s dataset is prepared from
    (:func:`ensemble_core.data.fingerprint_source`; ``data.builder`` imported first).

    Raises:
      DataError: see :func:`ensemble_core.data.fingerprint_source` and :func:`ensemble_core.data.import_builder`.
    """
    if data_cfg.builder is not None:
        data_lib.import_builder(data_cfg.builder, data_cfg.name)
    return data_lib.fingerprint_source(
        data_cfg.name, data_cfg.data_dir, data_cfg.manual_dir, user_source(data_cfg)
    ).fingerprint


@diskspace.output_errors(_data_dir, setting="data.data_dir")
def prepare(data_cfg: DataConfig) -> DatasetInfo:
    """Prepare (or find) ``data_cfg``'s dataset as array_record files (:func:`ensemble_core.data.prepare`):
    a TFDS dataset (``data.builder`` imported first, which registers it), an image folder or arrays.

    With ``data.classes``, the dataset as the run sees it (:func:`subset_view`: K classes,
    their names and counts; the snapshot is the dataset's), after checking that every kept
    class has training examples (:func:`check_training_examples`).

    Raises:
      DataError: an unknown dataset, files that cannot be found, are damaged or refused; a
        kept class without training examples.
      ConfigError: ``data.classes`` names a class the dataset does not have, or one twice.
      DiskFullError, OutputError: the TFDS data dir is full or read-only
        (:mod:`ensemble_core.diskspace`).
    """
    if data_cfg.builder is not None:
        data_lib.import_builder(data_cfg.builder, data_cfg.name)
    # what a user's builder prints while it generates examples: one log line, bounded
    printed = f"data.builder {data_cfg.builder} printed while the dataset was prepared"
    with captured_output(printed) if data_cfg.builder is not None else contextlib.nullcontext():
        info = data_lib.prepare(data_cfg.name, data_cfg.data_dir, data_cfg.manual_dir, user_source(data_cfg))
    view = subset_view(data_cfg, info)
    if view.class_indices is not None:
        check_training_examples(data_cfg, view)
    return view


def subset_view(data_cfg: DataConfig, dataset: DatasetInfo) -> DatasetInfo:
    """``dataset`` as a run with ``data.classes`` sees it (:func:`ensemble_core.data.subset_view`);
    ``dataset`` itself without ``data.classes`` or when it is that view already.

    Raises:
      ConfigError: see :func:`ensemble_core.data.resolve_classes`.
    """
    return data_lib.subset_view(dataset, data_cfg.classes)


def check_training_examples(data_cfg: DataConfig, dataset: DatasetInfo) -> None:
    """Refuse a kept class (``data.classes``) that has no example in the training split the
    members train on: the split filtered to the kept classes, capped by
    ``data.max_train_examples``, less the validation split. Counted from the snapshot's
    class counts; the training split's labels are read only when the cap cuts it.

    Raises:
      DataError: naming the first such class and why it has none.
    """
    kept = dataset.class_indices
    if kept is None:
        return
    counts = data_lib.class_counts(dataset, "train")
    whole = np.asarray([counts[i] if i < len(counts) else 0 for i in kept], np.int64)
    limit = data_cfg.max_train_examples
    capped = limit is not None and limit < int(whole.sum())
    if capped:
        _, raw = data_lib.load_split(data_cfg.name, "train", dataset.tfds_data_dir)
        labels = data_lib.keep_classes(raw, raw, kept, limit)[1]
    else:
        labels = np.repeat(np.arange(len(kept), dtype=np.int32), whole)
    before = np.bincount(labels, minlength=len(kept))
    if (data_cfg.validation_fraction > 0 or data_cfg.calibration_fraction > 0) and len(labels):
        carved = data_lib.calibration_split(labels, data_cfg.validation_fraction, data_cfg.calibration_fraction)
        labels = labels[carved[0]]
    left = np.bincount(labels, minlength=len(kept))
    if left.all():
        return
    k = int(np.flatnonzero(left == 0)[0])
    what = f"data.classes: class {dataset.class_names[k]!r} (index {kept[k]}) has no training examples"
    if whole[k] == 0:
        raise DataError(f"{what} in dataset '{dataset.name}'", fix="drop it from data.classes")
    if before[k] == 0:
        raise DataError(
            f"{what} among the first {limit} training examples of the kept classes (data.max_train_examples)",
            fix="raise data.max_train_examples, or drop the class from data.classes",
        )
    raise DataError(
        f"{what} once data.validation_fraction={data_cfg.validation_fraction} and data.calibration_fraction="
        f"{data_cfg.calibration_fraction} hold out its {int(before[k])}",
        fix=("raise data.max_train_examples, " if capped else "")
        + "lower data.validation_fraction or data.calibration_fraction, or drop the class from data.classes",
    )


SPLITS = ("train", "validation", "calibration", "test")


def _capped_train(cfg: PipelineConfig, dataset: DatasetInfo) -> int:
    limit = cfg.data.max_train_examples
    available = subset_view(cfg.data, dataset).num_train
    return available if limit is None else min(available, limit)


def num_validation(cfg: PipelineConfig, dataset: DatasetInfo) -> int:
    """Examples held out of the (filtered, capped) training split as the validation split."""
    return data_lib.validation_size(_capped_train(cfg, dataset), cfg.data.validation_fraction)


def num_calibration(cfg: PipelineConfig, dataset: DatasetInfo) -> int:
    """Examples held out of the (filtered, capped) training split as the calibration split."""
    return data_lib.validation_size(_capped_train(cfg, dataset), cfg.data.calibration_fraction)


def num_train(cfg: PipelineConfig, dataset: DatasetInfo) -> int:
    """Training examples the members train on: the split's (of the ``data.classes`` kept),
    capped by ``data.max_train_examples``, less the validation and calibration splits."""
    return _capped_train(cfg, dataset) - num_validation(cfg, dataset) - num_calibration(cfg, dataset)


def split_indices(cfg: PipelineConfig, labels: np.ndarray) -> dict[str, np.ndarray]:
    """Which examples of the (filtered, capped) training split each carve holds:
    ``{"train", "validation", "calibration": int64 sorted indices}``, pairwise disjoint
    (:func:`ensemble_core.data.calibration_split` with ``data.validation_fraction`` and
    ``data.calibration_fraction``)."""
    train, val, cal = data_lib.calibration_split(labels, cfg.data.validation_fraction, cfg.data.calibration_fraction)
    return {"train": train, "validation": val, "calibration": cal}


def load(cfg: PipelineConfig, dataset: DatasetInfo, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 ``[N, H, W, C]`` and labels int32 ``[N]`` of ``split``.

    ``'train'``, ``'validation'`` and ``'calibration'`` are the dataset's training split,
    capped by ``data.max_train_examples``, carved by :func:`split_indices`
    (``data.validation_fraction``, ``data.calibration_fraction``); ``'test'`` is the test split capped by
    ``data.max_test_examples``. With ``data.classes``, each split is first filtered to the
    kept classes, its labels remapped to ``0..K-1`` (:func:`ensemble_core.data.keep_classes`),
    then capped: the first N examples of the kept classes.

    Raises:
      ValueError: an unknown split. DataError: see :func:`ensemble_core.data.load_split`.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split '{split}'; fix: use one of {SPLITS}")
    kept = subset_view(cfg.data, dataset).class_indices
    name, where = cfg.data.name, dataset.tfds_data_dir
    limit = cfg.data.max_test_examples if split == "test" else cfg.data.max_train_examples
    read = "test" if split == "test" else "train"
    if kept is None:
        images, labels = data_lib.load_split(name, read, where, limit)
    else:
        images, labels = data_lib.keep_classes(*data_lib.load_split(name, read, where), kept, limit)
    if split == "test":
        return images, labels
    if not cfg.has_validation and not cfg.has_calibration:
        return (images, labels) if split == "train" else (images[:0], labels[:0])
    idx = split_indices(cfg, labels)[split]
    return images[idx], labels[idx]


def split_lineage(cfg: PipelineConfig, dataset: DatasetInfo, split: str) -> dict:
    """Which examples a carve of the training split holds, as a record: ``split``, the
    snapshot's ``fingerprint``, ``fraction`` (``data.validation_fraction`` or
    ``data.calibration_fraction``), ``seed`` (the carve's fixed seed), ``examples``,
    ``class_counts`` (``[K]``) and ``indices_sha256`` (of the int64 indices into the
    filtered, capped training split, :func:`split_indices`), so that a record names the
    exact examples and two runs can be checked to have held out the same ones.

    Raises:
      ValueError: ``split`` is not ``'validation'`` or ``'calibration'``.
    """
    if split not in ("validation", "calibration"):
        raise ValueError(f"split '{split}' is not a carve of the training split; fix: use validation or calibration")
    kept = subset_view(cfg.data, dataset).class_indices
    name, where, limit = cfg.data.name, dataset.tfds_data_dir, cfg.data.max_train_examples
    if kept is None:
        _, labels = data_lib.load_split(name, "train", where, limit)
    else:
        labels = data_lib.keep_classes(*data_lib.load_split(name, "train", where), kept, limit)[1]
    idx = split_indices(cfg, labels)[split].astype(np.int64)
    fraction = cfg.data.validation_fraction if split == "validation" else cfg.data.calibration_fraction
    seed = data_lib.VALIDATION_SEED if split == "validation" else data_lib.CALIBRATION_SEED
    return {
        "split": split,
        "fingerprint": None if dataset.snapshot is None else dataset.snapshot.fingerprint,
        "fraction": fraction,
        "seed": seed,
        "examples": len(idx),
        "class_counts": np.bincount(labels[idx], minlength=dataset.num_classes).tolist(),
        "indices_sha256": hashlib.sha256(idx.tobytes()).hexdigest(),
    }


def load_held_out(cfg: PipelineConfig, dataset: DatasetInfo) -> tuple[np.ndarray, np.ndarray]:
    """The test images of every class ``data.classes`` leaves out: uint8 ``[M, H, W, C]``
    and their labels in the dataset, int32 ``[M]``; the first ``data.max_test_examples`` of
    them, as the kept classes' test split is capped (:func:`ensemble_core.data.load_held_out`).

    Raises:
      DataError: ``data.classes`` is unset (nothing is held out); see
        :func:`ensemble_core.data.load_split`.
    """
    view = subset_view(cfg.data, dataset)
    if view.class_indices is None:
        raise DataError(
            "no class is held out: data.classes is not set, so every class trains",
            fix="set data.classes to the classes to train on",
        )
    return data_lib.load_held_out(cfg.data.name, view.tfds_data_dir, view.class_indices, cfg.data.max_test_examples)
