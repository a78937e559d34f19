"""The prediction flow's steps on files: which run, which images, the predictions written.

:func:`resolve_run` picks the run (given, or the output directory's champion),
:func:`images_file` gives a TFDS split as a ``.npy`` (exported once), :func:`preflight`
checks everything before the model runs, and :func:`predict_inputs` predicts the user's
inputs (image files, folders, globs or one array file: :mod:`.inputs`) and writes the
ensemble's predictions of :func:`ensemble_core.runs.prediction.predict.predict_images` to an
``.npz`` and one row per image to a table (:mod:`.table`); :func:`predict_file` predicts one
``.npy`` to an ``.npz``. Every file is written atomically
(:func:`ensemble_core.runs.storage.layout.atomic_write`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ensemble_core import data as data_lib
from ensemble_core import diskspace
from ensemble_core.atomic import atomic_savez, atomic_write
from ensemble_core.data.npz_arrays import check_npy_file
from ensemble_core.errors import CheckpointError, ConfigError, DataError
from ensemble_core.runs.prediction import inputs as inputs_lib
from ensemble_core.runs.prediction import table as table_lib
from ensemble_core.runs.prediction.predict import predict_images
from ensemble_core.runs.storage.champion_record import read_champion
from ensemble_core.runs.storage.layout import OutputDir
from ensemble_core.special_files import special_kind


def resolve_run(run_dir: str | None, output_dir: str | Path) -> tuple[str, str | None]:
    """``(run_dir, None)`` when a run is given, else the champion's ``(run_dir, run_name)``
    under ``output_dir``.

    Raises:
      DataError: no run given and no champion yet, or a damaged champion pointer (set
        aside by :func:`read_champion`; the message names the runs that could be passed).
    """
    if run_dir:
        return run_dir, None
    pointer = OutputDir(Path(output_dir)).champion
    existed = pointer.exists()
    champion = read_champion(output_dir)
    if champion is None and existed:
        runs = sorted(p.name for p in Path(output_dir).iterdir() if (p / "checkpoints").is_dir())
        named = f" (runs there: {', '.join(runs[:5])}{', ...' if len(runs) > 5 else ''})" if runs else ""
        raise DataError(
            f"the champion pointer {pointer.name} in '{output_dir}' is damaged and was set aside in corrupt-state/",
            fix=f"pass --run-dir of a trained run{named}, or train one (python -m flows.train_ensemble)",
        )
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


def read_images(images_npy: str | Path) -> np.ndarray:
    """The array of a ``.npy`` file, read without pickles (a ``.npz``: its ``images``
    array, :func:`ensemble_core.runs.prediction.inputs.read_npz`).

    Raises:
      DataError: the file is missing, unreadable or a special file (a FIFO, a device), is
        not a ``.npy`` (no NumPy header: a text or image file renamed), holds Python
        objects (a pickled object array), or its header claims a negative dimension or
        more data than the file holds (checked before anything is allocated).
    """
    path = Path(images_npy)
    if path.suffix.lower() == ".npz":
        return inputs_lib.read_npz(path)
    fix = "fix: save the images with numpy.save(path, images) as uint8 [N, H, W, C] (or float in [0, 1])"
    kind = special_kind(path)
    if kind is not None:  # opening a FIFO would block, a device read without end
        raise DataError(f"images file {str(path)!r} is {kind}, not a file; {fix}")
    try:
        with path.open("rb") as f:
            magic = f.read(len(inputs_lib.NPY_MAGIC))
    except FileNotFoundError:
        raise DataError(f"images file {str(path)!r} does not exist", fix="pass an existing .npy file") from None
    except OSError as err:
        raise DataError(
            f"cannot read images from {str(path)!r} ({err.strerror or type(err).__name__}); {fix}"
        ) from None
    if magic != inputs_lib.NPY_MAGIC:
        raise DataError(f"{str(path)!r} is not a .npy file (it has no NumPy header); {fix}")
    try:
        check_npy_file(path)  # the header bounded by the file's size before numpy allocates it
        return np.load(path, allow_pickle=False)
    except ValueError as err:
        if "pickle" in str(err):
            raise DataError(
                f"{str(path)!r} holds Python objects (a pickled object array), not image values; {fix}"
            ) from None
        raise DataError(f"cannot read images from {str(path)!r} ({' '.join(str(err).split())}); {fix}") from None
    except (OSError, EOFError) as err:
        raise DataError(
            f"cannot read images from {str(path)!r} ({type(err).__name__}: {' '.join(str(err).split())}); {fix}"
        ) from None


def check_output(output: str | Path, setting: str = "--output") -> None:
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
            f"cannot write the predictions to {str(output)!r} ({err.strerror or type(err).__name__}); "
            f"fix: choose a writable {setting}"
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


def run_meta(run: str | Path) -> dict:
    """The checkpoint metadata of ``run`` (its config, dataset: image shape, classes).

    Raises:
      CheckpointError: ``run`` has no checkpoint.
    """
    from ensemble_core.runs.storage.checkpoint import EnsembleCheckpointer
    from ensemble_core.runs.storage.layout import RunDir

    if not RunDir(Path(run)).has_checkpoint():
        raise CheckpointError(
            f"run directory {str(run)!r} has no checkpoint",
            fix="pass the directory of a trained run as --run-dir, or train one (python -m flows.train_ensemble)",
        )
    with EnsembleCheckpointer(RunDir(Path(run)).checkpoints, read_only=True) as ckpt:
        return ckpt.read_meta()


def output_paths(
    run: str | Path, stem: str, output: str | Path | None = None, table: str | Path | None = None
) -> tuple[Path, Path]:
    """Where a prediction writes: ``(npz, table)``; default ``<run>/predictions-<stem>.npz``
    and the table beside the ``.npz`` with the suffix ``.csv``."""
    npz = Path(output) if output else Path(run) / f"predictions-{stem}.npz"
    return npz, Path(table) if table else npz.with_suffix(".csv")


def preflight(
    images: str | Sequence[str] | None,
    tfds_name: str | None,
    run_dir: str | None,
    output_dir: str | Path,
    output: str | None,
    table: str | None = None,
    tfds_split: str = "test",
) -> tuple[Path, Path]:
    """Every check of a prediction that can fail before the model runs: the run (given, or
    the champion) has a readable checkpoint and a model that builds here; the inputs exist
    and are what :func:`~ensemble_core.runs.prediction.inputs.expand_inputs` takes; an
    array file is readable, of values and a shape the model takes; image files decode to
    the run's geometry (with the run's ``data.on_bad_image: fail``: decoded here, every
    file); the outputs can be written. The command line runs it before Prefect starts, so
    a refusal is one line.

    Returns:
      ``(npz, table)``: the paths the prediction will write (:func:`output_paths`).

    Raises:
      DataError, CheckpointError, ConfigError: the first problem, in one line with its fix
        (ConfigError: the run's model does not import here, :func:`check_model_builds`).
    """
    from ensemble_core.runs.prediction.images import check_image_shape, check_image_values

    run, _ = resolve_run(run_dir, output_dir)
    meta = run_meta(run)
    check_model_builds(meta)
    raws = inputs_lib.input_list(images)
    if raws:
        found = inputs_lib.expand_inputs(raws)
        if found.array is not None:
            array = read_images(found.array)
            check_image_values(array)
            check_image_shape(array, tuple(meta["dataset"]["image_shape"]))
        else:
            settings = inputs_lib.decode_settings(meta)
            if settings.on_bad_image != "skip":  # skip lists bad files: nothing here to refuse
                inputs_lib.decode_inputs(found.files, settings)
    elif not tfds_name:
        raise DataError("no input: fix: pass --images (image files, folders, globs or a .npy) or --tfds-name")
    npz, table_path = output_paths(run, inputs_lib.output_stem(raws, tfds_name, tfds_split), output, table)
    check_output(npz)
    check_output(table_path, "--table")
    return npz, table_path


def _write(path: Path, write: Callable[[], None], setting: str) -> None:
    """``write()``, a full disk or read-only file system as its one-line OutputError."""
    try:
        write()
    except OSError as err:
        mapped = diskspace.as_output_error(err, path.parent, setting, rerun="run the command again")
        if mapped is None:
            raise
        raise mapped from None


def predict_inputs(
    run_dir: str | Path,
    images: str | Sequence[str],
    output: str | Path,
    table: str | Path | None = None,
) -> tuple[dict[str, np.ndarray], pd.DataFrame]:
    """Predict the user's inputs (image files, folders, globs, or one ``.npy``/``.npz``:
    :func:`~ensemble_core.runs.prediction.inputs.expand_inputs`) with the run; image files
    are decoded as the run's training decoded its images
    (:func:`~ensemble_core.runs.prediction.inputs.decode_inputs`). Writes, atomically, the
    arrays to ``output`` (``.npz``; for image files also ``input`` str ``[n]``, the file of
    each predicted row) and one row per input to ``table`` (default: ``output`` with the
    suffix ``.csv``; Parquet for ``.parquet``: :mod:`.table`).

    Returns:
      ``(result, table)``: the arrays of
      :func:`~ensemble_core.runs.prediction.predict.predict_images` for the images that
      decoded (``ensemble_probs`` float32 ``[n, C]``, ...) and the table, one row per input
      in input order (a file skipped by ``data.on_bad_image: skip``: its ``error``).

    Raises:
      DataError: an input refused (:mod:`.inputs`, :mod:`.images`).
      CheckpointError: the run has no readable checkpoint.
      DiskFullError, OutputError: an output cannot be written (full disk, read-only).
    """
    found = inputs_lib.expand_inputs(inputs_lib.input_list(images))
    extra: dict[str, np.ndarray] = {}
    if found.array is not None:
        array = read_images(found.array)
        result = predict_images(run_dir, array)
        name = inputs_lib.shown_path(found.array)
        sources: Sequence[str] = [f"{name}[{i}]" for i in range(len(result["ensemble_probs"]))]
        ok, errors = None, None
    else:
        decoded = inputs_lib.decode_inputs(found.files, inputs_lib.decode_settings(run_meta(run_dir)))
        result = predict_images(run_dir, decoded.images)
        sources, ok, errors = decoded.sources, decoded.ok, decoded.errors
        extra["input"] = np.asarray([s for s, good in zip(sources, ok, strict=True) if good], dtype=str)
    rows = table_lib.build_table(result, sources, ok, errors)
    npz, table_path = output_paths(run_dir, "", output, table)
    _write(npz, lambda: atomic_savez(npz, **result, **extra), "--output")
    _write(table_path, lambda: table_lib.write_table(rows, table_path), "--table")
    return result, rows


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
