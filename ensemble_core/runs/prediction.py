"""The prediction flow's steps on files: which run, which images, the predictions written.

:func:`resolve_run` picks the run (given, or the output directory's champion),
:func:`images_file` gives the images as a ``.npy`` (a TFDS split exported once), and
:func:`predict_file` writes the ensemble's predictions of
:func:`ensemble_core.runs.evaluation.predict_images` to an ``.npz``. Every file is
written atomically (:func:`ensemble_core.runs.layout.atomic_write`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble_core import data as data_lib
from ensemble_core.errors import DataError
from ensemble_core.runs.champion import read_champion
from ensemble_core.runs.evaluation import predict_images
from ensemble_core.runs.layout import atomic_savez, atomic_write


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
            f"no champion in '{output_dir}' yet; fix: train one (python -m flows.train_ensemble) or pass a run dir"
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
            raise DataError(f"images file '{images_npy}' does not exist; fix: pass an existing .npy file")
        return images_npy
    if not tfds_name:
        raise DataError("no input: fix: pass images_npy (a .npy file) or tfds_name (a TFDS dataset)")
    info = data_lib.prepare(tfds_name, data_dir)
    images, _ = data_lib.load_split(tfds_name, tfds_split, info.tfds_data_dir)
    out = Path(data_dir or ".") / f"{tfds_name}-{tfds_split}-images.npy"
    atomic_write(out, lambda f: np.save(f, images))
    return str(out)


def predict_file(run_dir: str | Path, images_npy: str | Path, output: str | Path) -> dict[str, np.ndarray]:
    """Predict the images of ``images_npy`` with the run and write the result to
    ``output`` (``.npz``, atomically). Returns the arrays of
    :func:`~ensemble_core.runs.evaluation.predict_images` (``ensemble_probs`` float32
    ``[N, C]``, ``predictive_entropy`` and ``mutual_information`` float32 ``[N]`` in nats, ...).

    Raises:
      DataError: the file is not a readable ``.npy`` (no pickles), or its images are refused.
      CheckpointError: the run has no readable checkpoint.
    """
    try:
        images = np.load(images_npy, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise DataError(f"cannot read images from '{images_npy}' ({err}); fix: save them with numpy.save") from None
    result = predict_images(run_dir, images)
    atomic_savez(Path(output), **result)
    return result
