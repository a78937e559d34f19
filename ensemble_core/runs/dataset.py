"""The run's dataset: the config's data section applied to :mod:`ensemble_core.data`."""

from __future__ import annotations

import numpy as np

from ensemble_core import data as data_lib
from ensemble_core.config import DataConfig, PipelineConfig
from ensemble_core.data import DatasetInfo


def prepare(data_cfg: DataConfig) -> DatasetInfo:
    """Prepare (or find) ``data_cfg.name`` as array_record files (:func:`ensemble_core.data.prepare`).

    Raises:
      DataError: an unknown dataset, files that cannot be found or are damaged.
    """
    return data_lib.prepare(data_cfg.name, data_cfg.data_dir, data_cfg.manual_dir)


def num_train(cfg: PipelineConfig, dataset: DatasetInfo) -> int:
    """Training examples used: the split's, capped by ``data.max_train_examples``."""
    limit = cfg.data.max_train_examples
    return dataset.num_train if limit is None else min(dataset.num_train, limit)


def load(cfg: PipelineConfig, dataset: DatasetInfo, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 ``[N, H, W, C]`` and labels int32 ``[N]`` of ``split`` ('train' or
    'test'), capped by ``data.max_train_examples`` / ``data.max_test_examples``."""
    limit = cfg.data.max_train_examples if split == "train" else cfg.data.max_test_examples
    return data_lib.load_split(cfg.data.name, split, dataset.tfds_data_dir, limit)
