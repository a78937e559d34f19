"""Prefect tasks of the prediction flow, thin wrappers over
:mod:`ensemble_core.runs.prediction.files`: resolve which run to use, the images, then predict."""

from __future__ import annotations

import numpy as np
from prefect import get_run_logger, task

from ensemble_core.runs.prediction import files as prediction


@task(name="resolve_run")
def resolve_run(run_dir: str | None, output_dir: str) -> str:
    """``run_dir`` itself, or the champion's run directory under ``output_dir``.

    Raises:
      DataError: no run given and no champion yet.
    """
    path, champion = prediction.resolve_run(run_dir, output_dir)
    if champion is not None:
        get_run_logger().info("using champion %s", champion)
    return path


@task(name="load_images")
def load_images(images_npy: str | None, tfds_name: str | None, tfds_split: str, data_dir: str | None) -> str:
    """Check the input exists; returns the path of a ``.npy`` of images (a TFDS split is
    exported first, :func:`ensemble_core.runs.prediction.files.images_file`). Raises DataError
    on a missing or unreadable input."""
    return prediction.images_file(images_npy, tfds_name, tfds_split, data_dir)


@task(name="predict_images")
def predict_images(run_dir: str, images_npy: str, output: str) -> str:
    """Ensemble probabilities, predictive entropy and mutual information to ``output`` (.npz)."""
    result = prediction.predict_file(run_dir, images_npy, output)
    get_run_logger().info(
        "%d images: mean predictive entropy %.4f nats, mean mutual information %.4f nats -> %s",
        len(result["ensemble_probs"]),
        float(result["predictive_entropy"].mean()),
        float(result["mutual_information"].mean()),
        output,
    )
    names, counts = np.unique(result["predicted_name"], return_counts=True)
    get_run_logger().info("predicted classes: %s", ", ".join(f"{n}: {c}" for n, c in zip(names, counts, strict=True)))
    return output
