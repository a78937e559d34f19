"""CIFAR-10 offline, read through the project's own data code (``data.prepare``,
``data.load_split``) and the real TFDS ``cifar10`` builder, with
``tfds.testing.mock_data`` standing in for the download and the records.

What is real and what is mocked:

* real: the TFDS catalog builder ``cifar10`` (its code, version 3.0.2 and features:
  ``image`` ``Image(shape=(32, 32, 3))``, ``label`` ``ClassLabel(10)``, ``id``); its
  metadata (``dataset_info.json``, ``features.json``) written by TFDS into a temporary data
  dir, with one array_record shard per split whose record count is the split's; every
  check the project makes on a prepared dataset (``is_prepared``, ``verify_prepared``
  reading the shards' footers and counts, the split/feature/shape/channel checks);
  ``load_split``'s reading loop, stacking and label check.
* mocked (``tfds.testing.mock_data``, ``policy=MockPolicy.USE_FILES``):
  ``DatasetBuilder.__init__``'s data dir (the temporary one), ``download_and_prepare``
  (a no-op; never reached, the dataset is prepared) and ``as_data_source``: each split's
  source gives ``num_examples`` random examples of the builder's features, made by TFDS's
  ``RandomFakeGenerator`` (uint8 ``[32, 32, 3]`` images, labels in ``[0, 10)``), seeded
  per split, as many as the metadata lists for that split.

Why the records are mocked: the ``cifar10`` builder's ``Image`` feature PNG-encodes with
TensorFlow, which the project does not install, so real records cannot be written here;
the shard files hold placeholder records (the mocked data source never reads them).
``mock_data``'s own ``as_data_source`` gives every split the same length, hence
``as_data_source_fn``.

Use :func:`mocked_cifar10` as a context manager, or the fixture :func:`cifar10_tfds` (import
it into a test module).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import tensorflow_datasets as tfds
from array_record.python import array_record_module
from tensorflow_datasets.testing import mocking

NAME = "cifar10"
NUM_TRAIN = 64
NUM_TEST = 32
#: Seeds of the random examples per split (far apart: example i uses seed + i).
_SEEDS = {"train": 0, "test": 1_000_000}


def write_metadata(root: str | Path, num_train: int = NUM_TRAIN, num_test: int = NUM_TEST) -> Path:
    """Write the real ``cifar10`` builder's metadata into the TFDS data dir ``root``, with a
    ``train`` and a ``test`` split of one array_record shard each (placeholder records).

    Returns:
      the variant directory ``<root>/cifar10/3.0.2``.
    """
    builder = tfds.builder(NAME, data_dir=str(root), file_format="array_record")
    template = tfds.core.ShardedFileTemplate(
        data_dir=builder.data_path, dataset_name=NAME, filetype_suffix="array_record"
    )
    infos = [
        tfds.core.SplitInfo(
            name=split, shard_lengths=[n], num_bytes=n * 3072, filename_template=template.replace(split=split)
        )
        for split, n in (("train", num_train), ("test", num_test))
    ]
    builder.info.set_splits(tfds.core.SplitDict(infos))
    builder.data_path.mkdir(parents=True, exist_ok=True)
    builder.info.write_to_directory(builder.data_path)
    for info in infos:
        for path, n in zip(info.filepaths, info.shard_lengths, strict=True):
            writer = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
            for i in range(n):
                writer.write(f"placeholder {i}".encode())
            writer.close()
    return Path(builder.data_path)


class _RandomSource(Sequence):
    """A split's data source: ``n`` random examples of ``features``, decoded (numpy)."""

    def __init__(self, features, n: int, seed: int):
        self._generator = mocking.RandomFakeGenerator(features, n, seed=seed)
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._generator[i]

    def __getitems__(self, keys: Sequence[int]) -> list[Any]:
        return [self[i] for i in keys]


def _as_data_source(self, split, decoders=None, deserialize_method=None, **kwargs):
    """``DatasetBuilder.as_data_source`` under the mock: as many random examples as the
    metadata lists for ``split`` (a plain split name)."""
    del decoders, deserialize_method, kwargs
    n = self.info.splits[split].num_examples
    return _RandomSource(self.info.features, n, _SEEDS.get(split, 2_000_000))


@contextlib.contextmanager
def mocked_cifar10(root: str | Path, num_train: int = NUM_TRAIN, num_test: int = NUM_TEST) -> Iterator[str]:
    """CIFAR-10 in the TFDS data dir ``root``, readable with the project's
    ``data.prepare("cifar10", root)`` / ``data.load_split("cifar10", split, root)``
    while the context is open; yields ``str(root)``. Metadata already in ``root`` is
    reused (write it again with :func:`write_metadata` to change the sizes)."""
    root = Path(root)
    if not (root / NAME).exists():
        write_metadata(root, num_train, num_test)
    with tfds.testing.mock_data(
        policy=tfds.testing.MockPolicy.USE_FILES, data_dir=str(root), as_data_source_fn=_as_data_source
    ):
        yield str(root)


@pytest.fixture
def cifar10_tfds(tmp_path) -> Iterator[str]:
    """A TFDS data dir holding a mocked CIFAR-10 (64 train / 32 test), mocked for the
    duration of the test (:func:`mocked_cifar10`)."""
    with mocked_cifar10(tmp_path / "tfds") as root:
        yield root
