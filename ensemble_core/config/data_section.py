"""The ``data`` section of the run configuration: which dataset, how much of it, and its
on-device augmentation."""

from __future__ import annotations

from pydantic import Field

from ensemble_core.config.base import Section


class AugmentConfig(Section):
    """Data augmentation on device, inside the train step: drawn per member and per step, so
    members see different augmentations of the same batch. Validation, test and every
    evaluator never augment."""

    crop_padding: int = Field(
        0,
        ge=0,
        le=64,
        description="Random crop after zero-padding each side by this many pixels (He et al. 2016 use 4 on "
        "CIFAR's 32x32 images); 0: no crop. Must be smaller than the image's height and width.",
    )
    flip: bool = Field(
        False,
        description="Random horizontal flip with probability 1/2 (natural images such as CIFAR-10). Keep it off "
        "for digits and letters (mnist, mnist5k, svhn_cropped, emnist, ...): a flipped digit is another "
        "symbol or none, so the run refuses it there.",
    )


class DataConfig(Section):
    """Which dataset to train and evaluate on."""

    name: str = Field(
        "mnist5k",
        min_length=1,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="TFDS dataset name. 'mnist5k' is the embedded offline MNIST subset "
        "(4,000 train / 1,000 test); any TFDS catalog image dataset (mnist, "
        "fashion_mnist, cifar10, ...) works when prepared in data_dir.",
    )
    data_dir: str | None = Field(
        None,
        min_length=1,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="TFDS data directory (prepared array_record files live here). "
        "Default: TFDS's own default (~/tensorflow_datasets or $TFDS_DATA_DIR).",
    )
    manual_dir: str | None = Field(
        None,
        min_length=1,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Where the original dataset files were put by hand for offline "
        "preparation of a catalog dataset. Default: <data_dir>/downloads/manual.",
    )
    max_train_examples: int | None = Field(
        None, ge=1, description="Use only the first N training examples (None: all)."
    )
    max_test_examples: int | None = Field(None, ge=1, description="Use only the first N test examples (None: all).")
    validation_fraction: float = Field(
        0.1,
        ge=0,
        le=0.5,
        description="Fraction of the training split held out as the validation split (stratified by label, "
        "the same examples for every seed; data.max_train_examples applies first). Per-member validation, "
        "early stopping, ensemble selection and temperature scaling use it, never the test split. "
        "0: train on the whole split (no validation).",
    )
    augment: AugmentConfig = Field(
        default_factory=AugmentConfig, description="On-device augmentation of the training split (off by default)."
    )
