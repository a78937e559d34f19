"""Out-of-distribution with a source of your choosing, for any dataset: a synthetic set of
the literature, or another dataset (a TFDS dataset, an image folder, arrays) brought to
the training images' geometry. Several may run in one config, each under its own name::

    eval:
      evaluators:
        test: {}
        ood_noise: {type: ood, source: uniform_noise}
        ood_parts: {type: ood, source: image_folder, path: /data/other_parts}

Sources (``source``):

- ``uniform_noise``: every pixel of every channel uniform on 0..255, independent (the
  "Uniform" noise set of Liang et al. 2018, ODIN, and Hendrycks et al. 2019, Outlier
  Exposure);
- ``gaussian_noise``: every pixel ``N(0.5, 1)`` clipped to [0, 1], then to 0..255 (the
  "Gaussian" set of Outlier Exposure, Hendrycks, Mazeika & Dietterich 2019, section 4.2);
- ``constant``: each image one value per channel, uniform on 0..255 (the constant images
  of Nalisnick et al. 2019);
- ``shuffled_patches``: the test images themselves, each cut into ``patches x patches``
  tiles (default 4 x 4) put back in a random order (:func:`ensemble_core.shifts.shuffle_patches`;
  the jigsaw puzzles Yu et al. 2024 use as OOD data): every pixel of the data kept, its
  objects' shapes gone. The default OOD set beside uniform noise for every dataset without
  a real one of its own (a user's image folder or arrays): noise differs from the data in
  its pixel statistics already, and an ensemble detects it easily (AUROC near 1) whatever it
  learnt; shuffled patches differ only in what the image shows. Seeded by ``seed``, not
  cached (a permutation is cheap);
- ``tfds`` (``name``, optionally ``data_dir``/``manual_dir``), ``image_folder`` or
  ``arrays`` (``path``): a dataset prepared as a data snapshot like the training data
  (:func:`ensemble_core.data.prepare`), its ``split`` resized and converted with Pillow
  to the model's ``[H, W, C]`` (:func:`ensemble_core.image_decoding.convert_images`);
- ``held_out_classes``: the test images of the training dataset's classes that
  ``data.classes`` leaves out of training (:func:`ensemble_core.data.load_held_out`: the first
  ``data.max_test_examples`` of them, as the kept classes' test split is capped), the
  open-set setting: unseen classes of the same images. It needs ``data.classes`` (refused
  before any compute without it, or when it keeps every class) and takes no ``path``,
  ``name``, ``data_dir``, ``manual_dir`` or ``split: train``.

As many OOD images as test images (``num_examples`` to choose; a dataset gives at most its
split; ``held_out_classes`` all its images; ``shuffled_patches`` at most the test split, a
seeded random sample of it when fewer). Figures: :mod:`ensemble_core.evaluators.ood_base`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np
import pydantic

from ensemble_core import data as data_lib
from ensemble_core import image_decoding, shifts, timing
from ensemble_core.config import PipelineConfig
from ensemble_core.config.data_section import snake_case
from ensemble_core.data import DatasetInfo, image_folder
from ensemble_core.errors import ConfigError, DataError
from ensemble_core.evaluators import DATA, DERIVED, EvalContext, EvaluatorOutput, ood_base, shift_base, skipped

SYNTHETIC = ("uniform_noise", "gaussian_noise", "constant")
#: The test images with their patches shuffled (:func:`ensemble_core.shifts.shuffle_patches`).
SHUFFLED_PATCHES = "shuffled_patches"
DATASETS = ("tfds", "image_folder", "arrays")
#: The source of the classes ``data.classes`` leaves out of training.
HELD_OUT_CLASSES = "held_out_classes"
#: Held-out classes named in the OOD set's description (the rest are counted).
NAMES_SHOWN = 10
CACHE_VERSION = 1


class Options(pydantic.BaseModel):
    """The ``ood`` evaluator's options (see the module's docstring)."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")

    source: Literal[
        "uniform_noise",
        "gaussian_noise",
        "constant",
        "shuffled_patches",
        "tfds",
        "image_folder",
        "arrays",
        "held_out_classes",
    ] = pydantic.Field(
        "uniform_noise",
        description="The OOD set: a synthetic one, the test images with their patches shuffled "
        "(shuffled_patches), a dataset (tfds, image_folder, arrays), or the test images of the classes "
        "data.classes leaves out of training (held_out_classes).",
    )
    name: str | None = pydantic.Field(
        None, description="source tfds: the TFDS dataset; image_folder/arrays: the snapshot's name (default: path's)."
    )
    path: str | None = pydantic.Field(None, description="source image_folder or arrays: its directory.")
    split: Literal["train", "test"] = pydantic.Field("test", description="The dataset's split to use.")
    data_dir: str | None = pydantic.Field(None, description="Where the dataset is prepared (default: data.data_dir).")
    manual_dir: str | None = pydantic.Field(None, description="source tfds: its files for offline preparation.")
    num_examples: int | None = pydantic.Field(
        None, ge=1, description="OOD images (default: as many as test images; held_out_classes: all of them)."
    )
    seed: int = pydantic.Field(0, ge=0, le=2**32 - 1, description="The synthetic sets' seed.")
    patches: int = pydantic.Field(
        shifts.PATCH_GRID,
        ge=2,
        le=1024,
        description="source shuffled_patches: tiles per side (patches x patches tiles, each H // patches by "
        "W // patches pixels).",
    )

    @pydantic.model_validator(mode="after")
    def _source_settings(self) -> Options:
        if self.source in ("image_folder", "arrays") and self.path is None:
            raise ValueError(f"source {self.source} needs path, the directory of the OOD images")
        if self.source == "tfds" and self.name is None:
            raise ValueError("source tfds needs name, a TFDS dataset name such as mnist")
        if self.source in (*SYNTHETIC, SHUFFLED_PATCHES) and (self.path or self.name):
            raise ValueError(f"source {self.source} is synthetic: it takes no path or name")
        if self.source == HELD_OUT_CLASSES and (
            self.path or self.name or self.data_dir or self.manual_dir or self.split != "test"
        ):
            raise ValueError(
                f"source {HELD_OUT_CLASSES} is the test split of the training dataset's classes left out by "
                "data.classes: it takes no path, name, data_dir, manual_dir or split train"
            )
        return self


def synthetic_images(source: str, n: int, shape: tuple[int, int, int], seed: int) -> np.ndarray:
    """``n`` images uint8 ``[n, H, W, C]`` of a synthetic OOD set (the module's docstring
    gives each definition), drawn with ``np.random.default_rng(seed)``.

    Raises:
      ValueError: an unknown ``source``.
    """
    rng = np.random.default_rng(seed)
    if source == "uniform_noise":
        return rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    if source == "gaussian_noise":
        return np.round(np.clip(rng.normal(0.5, 1.0, (n, *shape)), 0.0, 1.0) * 255).astype(np.uint8)
    if source == "constant":
        values = rng.integers(0, 256, (n, 1, 1, shape[2]), dtype=np.uint8)
        return np.broadcast_to(values, (n, *shape)).copy()
    raise ValueError(f"unknown synthetic OOD set {source!r}; one of {SYNTHETIC}")


def dataset_images(opts: Options, shape: tuple[int, int, int], n: int, default_data_dir: str | None) -> np.ndarray:
    """The first ``n`` images of ``opts``' dataset split, prepared as a data snapshot and
    brought to ``shape`` with Pillow (an image folder or arrays is prepared at ``shape``,
    its files decoded as the run's own: every pixel format's full range mapped to 0-255).

    Raises:
      DataError: the dataset cannot be prepared (its one-line error), or its images
        cannot be converted to ``shape``.
    """
    data_dir = opts.data_dir or default_data_dir
    if opts.source == "image_folder" and not _classifier_layout(Path(str(opts.path))):
        return folder_images(Path(str(opts.path)), opts.split, shape, n)
    if opts.source == "tfds":
        name = str(opts.name)
        info = data_lib.prepare(name, data_dir, opts.manual_dir)
    else:
        path = str(opts.path)
        name = opts.name or snake_case(Path(path).absolute().name)
        # decoded as the run decodes its own images, to the model's geometry (so a 16-bit
        # or CMYK OOD image converts, and a refusal never names the run's data.channels)
        user = data_lib.UserSource(kind=opts.source, path=path, image_size=shape[:2], channels=shape[2])
        info = data_lib.prepare(name, data_dir, None, user)
    images, _ = data_lib.load_split(name, opts.split, info.tfds_data_dir, n)
    try:
        return image_decoding.convert_images(images, shape[:2], shape[2])
    except ValueError as err:
        raise DataError(
            f"the OOD images of {name} ({opts.split}, {images.shape[1:]}) cannot be converted to {shape}: {err}",
            fix="choose another OOD source, or convert its images to grey or RGB first",
        ) from None


def _classifier_layout(root: Path) -> bool:
    """Whether ``root`` is a training dataset's image folder: ``train/`` with two or more
    class folders (prepared as a data snapshot like the training data)."""
    try:
        with os.scandir(root / "train") as it:
            return sum(1 for e in it if not e.name.startswith(".") and e.is_dir()) >= 2
    except OSError:
        return False


def folder_images(root: Path, split: str, shape: tuple[int, int, int], n: int) -> np.ndarray:
    """The OOD images of a folder that is not a classifier's (:func:`_classifier_layout`):
    every image file under ``root/<split>`` (or ``root`` itself when it has no such
    folder), in one class folder, several, or loose; an OOD set needs no classes. At most
    ``n``, spread over the files in name order, decoded to ``shape`` with Pillow.

    Raises:
      DataError: ``root`` missing or not a folder, no image file under it, a special file
        among them, or a file that cannot be decoded; one line naming the path.
    """
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise DataError(f"OOD folder {root} {what}", fix="set path to the folder of the OOD images")
    base = root / split if (root / split).is_dir() else root
    files = image_folder.walk_files(base, refuse_special=True)
    if not files:
        raise DataError(
            f"OOD folder {base} holds no image file",
            fix=f"put the OOD images in {base} (loose, or in one or more subfolders)",
        )
    picked = [files[i] for i in shift_base.sample_indices(len(files), min(n, len(files)))]
    images, _ = image_folder.decode_images(picked, shape[:2], shape[2], shape, workers=1)
    return images


def check_held_out_classes(config: PipelineConfig, dataset: DatasetInfo, name: str = "ood") -> DatasetInfo:
    """The run's view of ``dataset`` (:func:`ensemble_core.data.subset_view`) when source
    ``held_out_classes`` of evaluator ``name`` has classes to score.

    Raises:
      DataError: ``data.classes`` is not set (every class trains: none is held out), or
        it lists every class of the dataset.
      ConfigError: see :func:`ensemble_core.data.resolve_classes`.
    """
    view = data_lib.subset_view(dataset, config.data.classes)
    where = f"eval.evaluators.{name}: source {HELD_OUT_CLASSES} scores the classes left out of training"
    if view.class_indices is None:
        raise DataError(
            f"{where}, and data.classes is not set (every class trains)",
            fix="set data.classes to the classes to train on",
        )
    everything = data_lib.full_class_names(view)
    if everything and len(view.class_indices) >= len(everything):
        raise DataError(
            f"{where}, and data.classes lists all {len(everything)} classes of '{view.name}'",
            fix="leave the classes to score as out-of-distribution out of data.classes",
        )
    return view


def held_out_images(ctx: EvalContext, n: int | None) -> tuple[np.ndarray, str]:
    """The first ``n`` (None: all) test images of the classes ``data.classes`` leaves out,
    and their description.

    Raises:
      DataError: see :func:`check_held_out_classes`; the test split holds no image of a
        held-out class.
    """
    view = check_held_out_classes(ctx.config, ctx.dataset, ctx.name or "ood")
    kept = view.class_indices or ()
    images, labels = data_lib.load_held_out(
        ctx.config.data.name, view.tfds_data_dir, kept, ctx.config.data.max_test_examples
    )
    images, labels = images[:n], labels[:n]
    everything = data_lib.full_class_names(view)
    held = sorted(set(range(len(everything))) - set(kept)) if everything else sorted(set(labels.tolist()))
    names = ", ".join(everything[i] if everything else str(i) for i in held[:NAMES_SHOWN])
    names += f", ... ({len(held)} classes)" if len(held) > NAMES_SHOWN else ""
    if not len(images):
        raise DataError(
            f"eval.evaluators.{ctx.name or 'ood'}: the test split of '{view.name}' has no image of the held-out "
            f"classes ({names})",
            fix="leave other classes out of data.classes, or choose another ood source",
        )
    return images, f"{HELD_OUT_CLASSES} {names} of {view.name} (test, {len(images)} images)"


def check(config: PipelineConfig, dataset: DatasetInfo, name: str, opts: Options) -> None:
    """Refuse, before any compute, an OOD set this run cannot score: ``held_out_classes``
    with no class held out (:func:`check_held_out_classes`), or a dataset source that
    cannot be prepared or whose images cannot be converted to the model's ``[H, W, C]``
    (it is prepared now, as evaluation would, and one image converted; the snapshot is
    reused by the evaluation; an image folder that is no classifier's layout is not
    prepared: every file evaluation will score is decoded now, so that one it cannot
    decode is refused before training, not after).

    A ``shuffled_patches`` grid larger than the images is refused too (:func:`requirements`;
    :func:`ensemble_core.evaluators.check_data` skips a default evaluator it concerns before
    calling this).

    Raises:
      DataError, ConfigError: the one-line refusal.
    """
    if opts.source == HELD_OUT_CLASSES:
        check_held_out_classes(config, dataset, name)
    elif opts.source == SHUFFLED_PATCHES:
        height, width = (int(d) for d in dataset.image_shape[:2])
        if opts.patches > min(height, width):
            raise ConfigError(
                f"config key 'eval.evaluators.{name}.patches': {opts.patches} x {opts.patches} tiles do not fit "
                f"the {height}x{width} images",
                fix=f"give patches between 2 and {min(height, width)}",
            )
    elif opts.source in DATASETS:
        height, width, channels = (int(d) for d in dataset.image_shape)
        n = 1
        if opts.source == "image_folder" and not _classifier_layout(Path(str(opts.path))):
            # loose files are decoded only when scored: decode now every file evaluate() will
            view = data_lib.subset_view(dataset, config.data.classes)
            n = opts.num_examples or min(view.num_test, config.data.max_test_examples or view.num_test)
        try:
            dataset_images(opts, (height, width, channels), n, config.data.data_dir)
        except DataError as err:
            raise DataError(f"eval.evaluators.{name}: {err.problem}", fix=err.fix) from None


def requirements(config: PipelineConfig, dataset: DatasetInfo, opts: Options) -> str | None:
    """What ``opts`` need of the data that ``dataset`` lacks (``shuffled_patches``: a
    ``patches x patches`` grid of tiles of one pixel or more), or None; checked in the
    preflight (:func:`ensemble_core.evaluators.check_data`) and again by :func:`evaluate`."""
    height, width = (int(d) for d in dataset.image_shape[:2])
    if opts.source == SHUFFLED_PATCHES and opts.patches > min(height, width):
        return (
            f"{opts.patches} x {opts.patches} patches do not fit the {height}x{width} images "
            f"(patches between 2 and {min(height, width)} do)"
        )
    return None


def evaluate(ctx: EvalContext) -> EvaluatorOutput:
    """The test split vs the OOD set of ``ctx.options``; see :mod:`ensemble_core.evaluators.ood_base`."""
    opts: Options = ctx.options
    if (unmet := requirements(ctx.config, ctx.dataset, opts)) is not None:
        return skipped(unmet)
    if opts.source == HELD_OUT_CLASSES:
        images, what = held_out_images(ctx, opts.num_examples)
        return ood_base.evaluate_ood(ctx, images, what)
    height, width, channels = (int(d) for d in ctx.dataset.image_shape)
    shape = (height, width, channels)
    n = opts.num_examples or len(ctx.load("test")[0])
    if opts.source == SHUFFLED_PATCHES:
        test = ctx.load("test")[0]
        picked = test[shift_base.sample_indices(len(test), n)]
        with timing.part(DERIVED):
            images = shifts.shuffle_patches(picked, opts.patches, opts.seed)
        what = f"{SHUFFLED_PATCHES} {opts.patches}x{opts.patches} of the test images ({len(images)}, seed {opts.seed})"
    elif opts.source in SYNTHETIC:
        key = f"ood-{opts.source}-v{CACHE_VERSION}-{n}-{'x'.join(map(str, shape))}-seed{opts.seed}"
        build = lambda: {"images": synthetic_images(opts.source, n, shape, opts.seed)}  # noqa: E731
        images = ctx.cached(key, build, {"images": (n, *shape)})["images"]
        what = f"{opts.source} ({n} images, seed {opts.seed})"
    else:
        with timing.part(DATA):
            images = dataset_images(opts, shape, n, ctx.config.data.data_dir)
        what = f"{opts.source} {opts.name or opts.path} ({opts.split}, {len(images)} images)"
    return ood_base.evaluate_ood(ctx, images, what)


def plot(metrics: dict, arrays: dict, plots_dir: Path, config: PipelineConfig, name: str = "ood") -> dict[str, Path]:
    """Entropy histograms and ROC curves (:func:`ensemble_core.evaluators.ood_base.plot_ood`)."""
    return ood_base.plot_ood(metrics, arrays, plots_dir, name)


def markdown(metrics: dict) -> list[str]:
    """The detection table."""
    return ood_base.markdown(metrics, f"OOD: {metrics.get('source', 'ood')}")


def table(metrics: dict) -> list[dict]:
    """The Prefect table artifact's rows (:func:`ensemble_core.evaluators.ood_base.table`)."""
    return ood_base.table(metrics)
