"""The ``data`` section of the run configuration: which dataset, how much of it, and its
on-device augmentation."""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import PurePath
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ensemble_core.config.base import Section

#: The names TFDS accepts for a dataset (``tensorflow_datasets.core.naming``): snake_case.
DATASET_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
#: The embedded dataset's name, data.name's default.
EMBEDDED_NAME = "mnist5k"
#: Where each source gets its images (``data.source``).
SOURCES = ("tfds", "image_folder", "arrays")


def snake_case(text: str) -> str:
    """``text`` as a TFDS dataset name: CamelCase split as TFDS's
    ``naming.camelcase_to_snakecase`` does, every other run of characters outside
    ``[a-z0-9]`` one ``_``, a leading digit prefixed with ``d`` (``"Parts 2024"`` ->
    ``parts_2024``, ``"MyParts"`` -> ``my_parts``)."""
    text = re.sub(r"(.)([A-Z][a-z0-9]+)", r"\1_\2", text)
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text).lower()
    text = re.sub(r"[^a-z0-9]+", "_", text).strip("_") or "dataset"
    return f"d{text}" if text[0].isdigit() else text


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

    source: Literal["tfds", "image_folder", "arrays"] = Field(
        "tfds",
        description="Where the images come from. 'tfds': a TFDS dataset named by data.name (the embedded "
        "mnist5k, mnist/fashion_mnist from their IDX files, the TFDS catalog, or data.builder). "
        "'image_folder': <data.path>/<split>/<class>/<image file> (PNG, JPEG and whatever Pillow reads), the "
        "layout of torchvision's ImageFolder; split 'train' is required, 'test' optional. 'arrays': "
        "<data.path>/train.npz and optionally test.npz, each with 'image' uint8 [N, H, W, C] or [N, H, W] and "
        "'label' integer [N] (read without pickles).",
    )
    name: str = Field(
        EMBEDDED_NAME,
        min_length=1,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="TFDS dataset name. 'mnist5k' is the embedded offline MNIST subset "
        "(4,000 train / 1,000 test); any TFDS catalog image dataset (mnist, "
        "fashion_mnist, cifar10, ...) works when prepared in data_dir. For image_folder and arrays: the "
        "name the snapshots are kept under (snake_case; default, also in place of 'mnist5k': data.path's last "
        "directory, snake_cased); "
        "with data.builder: the builder's dataset name (default: its class name, snake_cased, as TFDS names it).",
    )
    path: str | None = Field(
        None,
        min_length=1,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="The directory of an image_folder or arrays source (required there, refused with tfds).",
    )
    builder: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="package.module:Class of your own TFDS builder (a tfds.core.GeneratorBasedBuilder), imported "
        "before preparation so that TFDS knows it; the dataset is then prepared like a catalog one (with "
        "data.manual_dir for its files). Only with source 'tfds'.",
    )
    image_size: tuple[int, int] | None = Field(
        None,
        description="[H, W]: resize every image of an image_folder or arrays source to H x W pixels, with Pillow's "
        "bilinear filter, antialiased when shrinking (Image.resize with Resampling.BILINEAR, the method of "
        "torchvision.transforms.Resize). None: every image must already have the same size.",
    )
    channels: Literal[1, 3] | None = Field(
        None,
        description="Convert every image of an image_folder or arrays source to 1 (grey, Pillow's 'L': ITU-R "
        "601-2 luma) or 3 (RGB) channels. None: every image must already have the same channels (grey or RGB).",
    )
    class_names: tuple[str, ...] | None = Field(
        None,
        description="The classes of an arrays source, label 0 first (None: '0', '1', ... up to the largest "
        "label). An image_folder's classes are its class folders' names, sorted.",
    )
    classes: tuple[int | str, ...] | None = Field(
        None,
        description="Train on these classes only, each a class index (int) or a class name (str: an image folder's "
        "class folder, data.class_names of arrays, a TFDS dataset's label names; '0', '1', ... for a dataset "
        "without names); None: every class. The members have K outputs, labels 0..K-1 in the order of the "
        "dataset's class indices (the order of this list does not matter). Training, validation and the test "
        "split (every evaluator that reads it) hold only these classes: each split filtered to them, then capped "
        "by data.max_train_examples / max_test_examples; the ood evaluator's source held_out_classes scores the "
        "other classes' test images as out-of-distribution. The prepared data snapshot is the dataset's, shared "
        "by every subset. Refused: fewer than two classes, an unknown name or index, a class listed twice, a "
        "class without training examples; changing it on resume.",
    )
    test_fraction: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Without a test split (no <path>/test folder, no test.npz): this fraction of the training "
        "images, stratified by class with a fixed seed, is the test split -- the same images while the files "
        "are unchanged.",
    )
    on_bad_image: Literal["fail", "skip"] = Field(
        "fail",
        description="An image_folder file Pillow cannot read (truncated, damaged, not an image): 'fail' refuses "
        "the preparation naming the file; 'skip' leaves it out, logs each and records the count in the "
        "snapshot's lineage.",
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
    calibration_fraction: float = Field(
        0.1,
        ge=0,
        le=0.5,
        description="Fraction of the training split held out as the calibration split (stratified, the same "
        "examples for every seed, disjoint from the validation split): the prediction sets and the abstention "
        "threshold are fitted on it (prediction_sets, abstention), so it neither trains nor selects the "
        "ensemble. 0: no calibration split.",
    )
    augment: AugmentConfig = Field(
        default_factory=AugmentConfig, description="On-device augmentation of the training split (off by default)."
    )

    @field_validator("image_size")
    @classmethod
    def _image_size_positive(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not all(1 <= side <= 16384 for side in value):
            raise ValueError(f"data.image_size {list(value)} must be two sides in 1..16384 pixels, [H, W]")
        return value

    @field_validator("class_names")
    @classmethod
    def _class_names_one_line(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        """Each name normalised to Unicode NFC (as an image folder's class folders are);
        refused, escaped with ``repr`` so the message is one line: a name with a control
        character (category Cc: newline, tab, ...) or a line/paragraph separator, a blank
        name, a name that begins or ends with white space (the class map is stored one
        stripped name per line)."""
        if value is None:
            return None
        names = tuple(unicodedata.normalize("NFC", name) for name in value)
        for name in names:
            bad = [ch for ch in name if unicodedata.category(ch) in ("Cc", "Zl", "Zp")]
            if bad:
                raise ValueError(
                    f"data.class_names: {name!r} has the control character {bad[0]!r}: a class name is stored as "
                    "one line of the class map; fix: remove newlines, tabs and other control characters"
                )
            if not name.strip() or name != name.strip():
                raise ValueError(
                    f"data.class_names: {name!r} is blank or begins or ends with white space: the class map stores "
                    f"names stripped; fix: write {name.strip()!r}" + ("" if name.strip() else " a name")
                )
        return names

    @field_validator("classes", mode="before")
    @classmethod
    def _classes_are_indices_or_names(cls, value: Any) -> Any:
        """Refuse booleans (pydantic would read true as class 1) and what is no list."""
        if isinstance(value, list | tuple) and any(isinstance(c, bool) for c in value):
            raise ValueError(f"data.classes {list(value)} must be class indices (int) or class names (str)")
        return value

    @field_validator("classes")
    @classmethod
    def _classes_distinct(cls, value: tuple[int | str, ...] | None) -> tuple[int | str, ...] | None:
        """Two or more distinct classes, no negative index, no empty name; sorted (indices
        first, then names), so that a reordered list is the same config."""
        if value is None:
            return None
        if len(value) < 2:
            raise ValueError(
                f"data.classes {list(value)} keeps fewer than two classes: a classifier needs two or more "
                "(leave data.classes out to train on every class)"
            )
        for c in value:
            if (isinstance(c, int) and c < 0) or (isinstance(c, str) and not c):
                raise ValueError(f"data.classes {list(value)}: {c!r} is neither a class index (0, 1, ...) nor a name")
            if value.count(c) > 1:
                raise ValueError(f"data.classes {list(value)} lists class {c!r} twice")
        return tuple(sorted(value, key=lambda c: (isinstance(c, str), c)))

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        """A name for a source that has none: data.path's last directory, or the builder's class."""
        if not isinstance(data, dict):
            return data
        files = data.get("source", "tfds") != "tfds" and isinstance(data.get("path"), str) and data["path"].strip()
        # The embedded dataset's name, the default that configs/default.yaml spells out, is no
        # name for a user's images: a config that switches data.source keeps working.
        if files and data.get("name", EMBEDDED_NAME) == EMBEDDED_NAME:
            # abspath: "." or "shelf/.." name the folder they mean, not "dataset"
            return {**data, "name": snake_case(PurePath(os.path.abspath(data["path"])).name or "dataset")}
        if "name" in data:
            return data
        if isinstance(data.get("builder"), str) and ":" in data["builder"]:
            return {**data, "name": snake_case(data["builder"].rsplit(":", 1)[1])}
        return data

    @model_validator(mode="after")
    def _source_settings_agree(self) -> DataConfig:
        files = self.source != "tfds"
        if files and self.path is None:
            raise ValueError(f"data.source={self.source} needs data.path, the directory of your images")
        if not files and self.path is not None:
            raise ValueError("data.path is only read by data.source image_folder or arrays; fix: set data.source")
        if files and self.builder is not None:
            raise ValueError("data.builder is a TFDS builder: it needs data.source=tfds, not " + self.source)
        for key in ("image_size", "channels"):
            if not files and getattr(self, key) is not None:
                raise ValueError(
                    f"data.{key} applies to image_folder and arrays sources; fix: drop it or set data.source"
                )
        if self.class_names is not None and self.source != "arrays":
            raise ValueError(
                "data.class_names names the labels of an arrays source (an image_folder's classes are its folders); "
                "fix: drop it or set data.source=arrays"
            )
        if self.class_names is not None and (
            len(set(self.class_names)) != len(self.class_names) or len(self.class_names) < 2
        ):
            raise ValueError(
                f"data.class_names must be two or more distinct names (in Unicode NFC), not {list(self.class_names)}"
            )
        if (files or self.builder is not None) and not DATASET_NAME.match(self.name):
            raise ValueError(
                f"data.name '{self.name}' is not a TFDS dataset name; fix: use snake_case, e.g. "
                f"'{snake_case(self.name)}'"
            )
        return self
