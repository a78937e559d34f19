"""The run's dataset: the config's data section applied to :mod:`ensemble_core.data`."""

from __future__ import annotations

import numpy as np

from ensemble_core import data as data_lib
from ensemble_core import diskspace
from ensemble_core.config import DataConfig, PipelineConfig
from ensemble_core.data import DatasetInfo, UserSource


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

    Raises:
      DataError: an unknown dataset, files that cannot be found, are damaged or refused.
      DiskFullError, OutputError: the TFDS data dir is full or read-only
        (:mod:`ensemble_core.diskspace`).
    """
    if data_cfg.builder is not None:
        data_lib.import_builder(data_cfg.builder, data_cfg.name)
    return data_lib.prepare(data_cfg.name, data_cfg.data_dir, data_cfg.manual_dir, user_source(data_cfg))


SPLITS = ("train", "validation", "test")


def _capped_train(cfg: PipelineConfig, dataset: DatasetInfo) -> int:
    limit = cfg.data.max_train_examples
    return dataset.num_train if limit is None else min(dataset.num_train, limit)


def num_validation(cfg: PipelineConfig, dataset: DatasetInfo) -> int:
    """Examples held out of the (capped) training split as the validation split."""
    return data_lib.validation_size(_capped_train(cfg, dataset), cfg.data.validation_fraction)


def num_train(cfg: PipelineConfig, dataset: DatasetInfo) -> int:
    """Training examples the members train on: the split's, capped by
    ``data.max_train_examples``, less the validation split."""
    return _capped_train(cfg, dataset) - num_validation(cfg, dataset)


def load(cfg: PipelineConfig, dataset: DatasetInfo, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 ``[N, H, W, C]`` and labels int32 ``[N]`` of ``split``.

    ``'train'`` and ``'validation'`` are the dataset's training split, capped by
    ``data.max_train_examples``, carved by :func:`ensemble_core.data.validation_split`
    with ``data.validation_fraction``; ``'test'`` is the test split capped by
    ``data.max_test_examples``.

    Raises:
      ValueError: an unknown split. DataError: see :func:`ensemble_core.data.load_split`.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split '{split}'; fix: use one of {SPLITS}")
    if split == "test":
        return data_lib.load_split(cfg.data.name, "test", dataset.tfds_data_dir, cfg.data.max_test_examples)
    images, labels = data_lib.load_split(cfg.data.name, "train", dataset.tfds_data_dir, cfg.data.max_train_examples)
    if not cfg.has_validation:
        return (images, labels) if split == "train" else (images[:0], labels[:0])
    train_idx, val_idx = data_lib.validation_split(labels, cfg.data.validation_fraction)
    idx = train_idx if split == "train" else val_idx
    return images[idx], labels[idx]
