"""The prediction flow's steps on files: which run, which images, the predictions written.

:func:`resolve_run` picks the run (given, or the output directory's champion),
:func:`images_file` gives the images as a ``.npy`` (a TFDS split exported once), and
:func:`predict_file` writes the ensemble's predictions of
:func:`ensemble_core.runs.prediction.predict.predict_images` to an ``.npz``. Every file is
written atomically (:func:`ensemble_core.runs.storage.layout.atomic_write`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble_core import data as data_lib
from ensemble_core import diskspace
from ensemble_core.atomic import atomic_savez, atomic_write
from ensemble_core.errors import CheckpointError, ConfigError, DataError
from ensemble_core.runs.prediction.predict import predict_images
from ensemble_core.runs.storage.champion_record import read_champion
from ensemble_core.special_files import special_kind


def resolve_run(run_dir: str | None, output_dir: str | Path) -> tuple[str, str | None]:
    """``(run_dir, None)`` when a run is given, else the champion's ``(run_dir, run_name)``
    under ``output_dir``.

    Raises:
      DataError: no run given and no champion yet.
    """
    if run_dir:
        return run_dir, None
    champion = read_champion(output_dir)
    if champion is None:
        raise DataError(
            f"no champion in '{output_dir}' yet", fix="train one (python -m flows.train_ensemble) or pass a run dir"
        )
    return champion["run_dir"], champion["run_name"]


def images_file(images_npy: str | None, tfds_name: str | None, tfds_split: str, data_dir: str | None) -> str:
    """The path of a ``.npy`` of images: ``images_npy`` if it exists, else TFDS split
    ``tfds_name``/``tfds_split`` (uint8 ``[N, H, W, C]``) exported, atomically, to
    ``<data_dir or .>/<tfds_name>-<tfds_split>-images.npy``.

    Raises:
      DataError: a missing ``images_npy``, no input at all, or an unreadable dataset.
    """
    if images_npy:
        if not Path(images_npy).is_file():
            raise DataError(f"images file '{images_npy}' does not exist", fix="pass an existing .npy file")
        return images_npy
    if not tfds_name:
        raise DataError("no input: fix: pass images_npy (a .npy file) or tfds_name (a TFDS dataset)")
    info = data_lib.prepare(tfds_name, data_dir)
    images, _ = data_lib.load_split(tfds_name, tfds_split, info.tfds_data_dir)
    out = Path(data_dir or ".") / f"{tfds_name}-{tfds_split}-images.npy"
    atomic_write(out, lambda f: np.save(f, images))
    return str(out)


NPY_MAGIC = b"\x93NUMPY"


def read_images(images_npy: str | Path) -> np.ndarray:
    """The array of a ``.npy`` file, read without pickles.

    Raises:
      DataError: the file is missing, unreadable or a special file (a FIFO, a device), is
        not a ``.npy`` (no NumPy header: a text or image file renamed), or holds Python
        objects (a pickled object array).
    """
    path = Path(images_npy)
    fix = "fix: save the images with numpy.save(path, images) as uint8 [N, H, W, C] (or float in [0, 1])"
    kind = special_kind(path)
    if kind is not None:  # opening a FIFO would block, a device read without end
        raise DataError(f"images file '{path}' is {kind}, not a file; {fix}")
    try:
        with path.open("rb") as f:
            magic = f.read(len(NPY_MAGIC))
    except FileNotFoundError:
        raise DataError(f"images file '{path}' does not exist", fix="pass an existing .npy file") from None
    except OSError as err:
        raise DataError(f"cannot read images from '{path}' ({err.strerror or type(err).__name__}); {fix}") from None
    if magic != NPY_MAGIC:
        raise DataError(f"'{path}' is not a .npy file (it has no NumPy header); {fix}")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as err:
        if "pickle" in str(err):
            raise DataError(
                f"'{path}' holds Python objects (a pickled object array), not image values; {fix}"
            ) from None
        raise DataError(f"cannot read images from '{path}' ({err}); {fix}") from None
    except (OSError, EOFError) as err:
        raise DataError(f"cannot read images from '{path}' ({type(err).__name__}: {err}); {fix}") from None


def check_output(output: str | Path) -> None:
    """That ``output`` can be written: its directory exists (or can be made) and takes a
    file (one is created and removed).

    Raises:
      DataError: naming the path, the reason and the fix.
    """
    import tempfile

    parent = Path(output).absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".write-check-"):
            pass
    except OSError as err:
        raise DataError(
            f"cannot write the predictions to '{output}' ({err.strerror or type(err).__name__}); "
            f"fix: choose a writable --output"
        ) from None


def check_model_builds(meta: dict) -> None:
    """The run's model (its checkpoint metadata's ``model`` section) can be built here: a
    user's module that does not import where the prediction runs is refused in one line
    (:func:`ensemble_core.models.build_model`'s, naming the module or its missing
    dependency), never taken for a damaged checkpoint.

    Raises:
      ConfigError: the model cannot be built; the fix says to run where the module imports.
    """
    from ensemble_core.config import PipelineConfig
    from ensemble_core.networks import build_network

    try:
        build_network(PipelineConfig.model_validate(meta["config"]), int(meta["dataset"]["num_classes"]))
    except ConfigError as err:
        raise ConfigError(
            f"the run's model cannot be built here: {err.problem}",
            fix="predict where the run's model module imports (its directory as the current directory, or on "
            "PYTHONPATH, with its dependencies installed)",
        ) from None


def preflight(
    images_npy: str | None,
    tfds_name: str | None,
    run_dir: str | None,
    output_dir: str | Path,
    output: str | None,
) -> None:
    """Every check of a prediction that can fail before the model runs: the run (given, or
    the champion) has a readable checkpoint, the images file is a readable ``.npy`` of
    values and a shape the model takes, the output can be written. The command line runs
    it before Prefect starts, so a refusal is one line.

    Raises:
      DataError, CheckpointError, ConfigError: the first problem, in one line with its fix
        (ConfigError: the run's model does not import here, :func:`check_model_builds`).
    """
    from ensemble_core.runs.prediction.images import check_image_shape, check_image_values
    from ensemble_core.runs.storage.checkpoint import EnsembleCheckpointer
    from ensemble_core.runs.storage.layout import RunDir

    run, _ = resolve_run(run_dir, output_dir)
    if not RunDir(Path(run)).has_checkpoint():
        raise CheckpointError(
            f"run directory '{run}' has no checkpoint",
            fix="pass the directory of a trained run as --run-dir, or train one (python -m flows.train_ensemble)",
        )
    with EnsembleCheckpointer(RunDir(Path(run)).checkpoints, read_only=True) as ckpt:
        meta = ckpt.read_meta()
    check_model_builds(meta)
    if images_npy:
        images = read_images(images_npy)
        check_image_values(images)
        check_image_shape(images, tuple(meta["dataset"]["image_shape"]))
    elif not tfds_name:
        raise DataError("no input: fix: pass --images (a .npy file) or --tfds-name (a TFDS dataset)")
    stem = Path(images_npy).stem if images_npy else f"{tfds_name}"
    check_output(output or Path(run) / f"predictions-{stem}.npz")


def predict_file(run_dir: str | Path, images_npy: str | Path, output: str | Path) -> dict[str, np.ndarray]:
    """Predict the images of ``images_npy`` with the run and write the result to
    ``output`` (``.npz``, atomically). Returns the arrays of
    :func:`~ensemble_core.runs.prediction.predict.predict_images` (``ensemble_probs`` float32
    ``[N, C]``, ``predictive_entropy`` and ``mutual_information`` float32 ``[N]`` in nats, ...).

    Raises:
      DataError: the file is not a readable ``.npy`` (no pickles), or its images are refused.
      CheckpointError: the run has no readable checkpoint.
      DiskFullError, OutputError: ``output`` cannot be written (full disk, read-only).
    """
    images = read_images(images_npy)
    result = predict_images(run_dir, images)  # a damaged checkpoint: its CheckpointError
    try:
        atomic_savez(Path(output), **result)
    except OSError as err:
        mapped = diskspace.as_output_error(err, Path(output).parent, "--output", rerun="run the command again")
        if mapped is None:
            raise
        raise mapped from None
    return result
