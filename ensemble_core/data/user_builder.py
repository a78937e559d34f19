"""A user's image folder or arrays prepared as a TFDS dataset: the same array_record layout
as every other source, so training, evaluation and ``flows.predict`` read one format.

The builder is defined per preparation (not registered with TFDS); a prepared dataset is
read back with ``tfds.builder_from_directory``
(:func:`ensemble_core.data.preparation.tfds_builder`), in any process.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import ClassVar

import numpy as np
import tensorflow_datasets as tfds

from ensemble_core.data.preparation import (
    DatasetInfo,
    class_map_problem,
    describe_prepared,
    is_registered,
    prepared_variant,
)
from ensemble_core.data.sources import EMBEDDED, FILE_FORMAT, IDX_SOURCES, one_line
from ensemble_core.data.user_source import UserSource, UserSplits, read_user_source
from ensemble_core.errors import DataError

log = logging.getLogger(__name__)

#: The version every user dataset is prepared as (the snapshot's fingerprint tells states apart).
USER_VERSION = "1.0.0"


def user_builder_class(name: str, splits: UserSplits, source: UserSource) -> type:
    """A TFDS builder writing ``splits`` as dataset ``name`` (images as uint8 tensors:
    TFDS's ``Image`` feature would need TensorFlow to encode; the examples keep their
    order: ``disable_shuffling``)."""
    dataset_name = name
    shape = tuple(int(d) for d in splits.train[0].shape[1:])

    class UserImages(tfds.core.GeneratorBasedBuilder, skip_registration=True):  # type: ignore[call-arg]
        """Labelled images from the user's files."""

        name = dataset_name
        VERSION = tfds.core.Version(USER_VERSION)
        RELEASE_NOTES: ClassVar[dict[str, str]] = {USER_VERSION: f"Prepared from {source.kind} {source.path}."}

        def _info(self):
            return self.dataset_info_from_configs(
                description=f"{source.kind} {source.path}",
                features=tfds.features.FeaturesDict(
                    {
                        "image": tfds.features.Tensor(shape=shape, dtype=np.uint8),
                        "label": tfds.features.ClassLabel(names=list(splits.class_names)),
                    }
                ),
                supervised_keys=("image", "label"),
                disable_shuffling=True,
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(*splits.train), "test": self._generate_examples(*splits.test)}

        def _generate_examples(self, images, labels):
            for i in range(len(images)):
                yield i, {"image": images[i], "label": int(labels[i])}

    return UserImages


def check_splits(splits: UserSplits, source: UserSource) -> None:
    """Refuse, before anything is written, splits TFDS cannot write or read back as they
    are: a class map without one name per class that survives ``label.labels.txt``
    (:func:`~ensemble_core.data.preparation.class_map_problem`), or an empty split (TFDS
    fails on it with "No examples were yielded", which reads like a full disk).

    Raises:
      DataError: one line naming the cause and the fix.
    """
    problem = class_map_problem(splits.class_names, len(splits.class_names))
    if problem is not None:
        raise DataError(f"{source.kind} {source.path}: {problem}", fix="rename the class so that it is one line")
    for split in ("train", "test"):
        if len(getattr(splits, split)[1]):
            continue
        if split == "test" and splits.test_carved:
            raise DataError(
                f"{source.kind} {source.path}: the test split held out from train (data.test_fraction="
                f"{source.test_fraction!r}) is empty: every class has fewer than two usable examples",
                fix="add a test split (test/<class name>/ of an image folder, test.npz of arrays), or more examples "
                "per class",
            )
        raise DataError(
            f"{source.kind} {source.path}: the {split} split holds no usable example",
            fix=f"add {split} examples"
            + (", or remove the test split to hold out data.test_fraction of train" if split == "test" else ""),
        )


def check_user_name(name: str) -> None:
    """Refuse a user dataset named like a dataset TFDS or this package already knows
    (its prepared files would be read with that dataset's builder).

    Raises:
      DataError: naming the clash and the fix.
    """
    if name == EMBEDDED or name in IDX_SOURCES or is_registered(name):
        raise DataError(
            f"data.name '{name}' is the name of a TFDS dataset, not of your images",
            fix=f"give your dataset a name of its own (data.name: my_{name}), or drop data.name to name it after "
            "data.path's folder",
        )


def prepare_user_locked(name: str, data_dir: str, source: UserSource) -> tuple[DatasetInfo, tuple[str, ...]]:
    """Prepare ``source`` as dataset ``name`` in the TFDS data dir ``data_dir`` (the
    snapshot's directory) unless it is prepared there already (the caller holds the
    preparation lock and has refused a name TFDS knows, :func:`check_user_name`; see
    :func:`ensemble_core.data.prepare`).

    Returns:
      The prepared dataset's :class:`DatasetInfo` and the files left out as undecodable
      (``data.on_bad_image=skip``; empty when it was prepared before).

    Raises:
      DataError: every refusal of
        :func:`~ensemble_core.data.user_source.read_user_source` and of
        :func:`check_splits` (a bad class map, an empty split); a write that fails
        (naming the directory).
    """
    skipped: tuple[str, ...] = ()
    if prepared_variant(name, data_dir) is None:
        splits = read_user_source(source)
        check_splits(splits, source)
        builder = user_builder_class(name, splits, source)(data_dir=data_dir, file_format=FILE_FORMAT)
        try:
            builder.download_and_prepare(file_format=FILE_FORMAT)
        except Exception as err:
            raise DataError(
                f"cannot write '{name}' into {builder.data_dir} ({one_line(err)})",
                fix=f"check that {Path(data_dir)} is writable and has room, then run again",
            ) from err
        skipped = splits.skipped
        log.info(
            "prepared %s from %s %s: %d train / %d test images of %s, %d classes%s",
            name,
            source.kind,
            source.path,
            len(splits.train[1]),
            len(splits.test[1]),
            "x".join(map(str, splits.train[0].shape[1:])),
            len(splits.class_names),
            f", {len(skipped)} file(s) left out" if skipped else "",
        )
    variant = prepared_variant(name, data_dir)
    return describe_prepared(tfds.builder_from_directory(str(variant)), name, data_dir), skipped
