"""Prefect tasks of the prediction flow: resolve which run to use, then predict."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from prefect import get_run_logger, task

from ensemble_core import data as data_lib
from ensemble_core import runs
from ensemble_core.errors import DataError
from ensemble_core.runs import champion as champion_lib
from ensemble_core.runs.layout import atomic_savez


@task(name="resolve_run")
def resolve_run(run_dir: str | None, output_dir: str) -> str:
    """``run_dir`` itself, or the champion's run directory under ``output_dir``.

    Raises:
      DataError: no run given and no champion yet.
    """
    if run_dir:
        return run_dir
    champion = champion_lib.read_champion(output_dir)
    if champion is None:
        raise DataError(
            f"no champion in '{output_dir}' yet; fix: train one (python -m flows.train_ensemble) or pass a run dir"
        )
    get_run_logger().info("using champion %s", champion["run_name"])
    return champion["run_dir"]


@task(name="load_images")
def load_images(images_npy: str | None, tfds_name: str | None, tfds_split: str, data_dir: str | None) -> str:
    """Check the input exists; returns the path of a ``.npy`` of images (a TFDS split is
    exported to ``<run>/..`` first). Raises DataError on a missing or unreadable input."""
    if images_npy:
        if not Path(images_npy).is_file():
            raise DataError(f"images file '{images_npy}' does not exist; fix: pass an existing .npy file")
        return images_npy
    if not tfds_name:
        raise DataError("no input: fix: pass images_npy (a .npy file) or tfds_name (a TFDS dataset)")
    data_lib.prepare(tfds_name, data_dir)
    images, _ = data_lib.load_split(tfds_name, tfds_split, data_dir)
    out = Path(data_dir or ".") / f"{tfds_name}-{tfds_split}-images.npy"
    np.save(out, images)
    return str(out)


@task(name="predict")
def predict(run_dir: str, images_npy: str, output: str) -> str:
    """Ensemble probabilities, predictive entropy and mutual information to ``output`` (.npz)."""
    try:
        images = np.load(images_npy, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise DataError(f"cannot read images from '{images_npy}' ({err}); fix: save them with numpy.save") from None
    result = runs.predict_images(run_dir, images)
    atomic_savez(Path(output), **result)
    get_run_logger().info(
        "%d images: mean predictive entropy %.4f nats, mean mutual information %.4f nats -> %s",
        len(images),
        float(result["predictive_entropy"].mean()),
        float(result["mutual_information"].mean()),
        output,
    )
    return output
