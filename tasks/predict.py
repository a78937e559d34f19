"""Prefect tasks of the prediction flow, thin wrappers over
:mod:`ensemble_core.runs.prediction.files`: resolve which run to use, the images, then predict."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from ensemble_core.errors import DataError
from ensemble_core.runs.prediction import files as prediction
from ensemble_core.runs.prediction import inputs as inputs_lib
from ensemble_core.runs.prediction import table as table_lib

#: The keys of the artifacts a prediction publishes.
TABLE_ARTIFACT, SUMMARY_ARTIFACT = "predictions", "predictions-summary"


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
def load_images(images: list[str] | None, tfds_name: str | None, tfds_split: str, data_dir: str | None) -> list[str]:
    """The inputs to predict: ``images`` (image files, folders, globs or one ``.npy``/``.npz``;
    checked to exist, :func:`ensemble_core.runs.prediction.inputs.expand_inputs`), or TFDS
    split ``tfds_name``/``tfds_split`` exported to a ``.npy``
    (:func:`ensemble_core.runs.prediction.files.images_file`).

    Raises:
      DataError: a missing, special or unreadable input, or no input at all.
    """
    if images:
        inputs_lib.expand_inputs(images)
        return list(images)
    if not tfds_name:
        raise DataError("no input: fix: pass images (image files, folders, globs or a .npy) or tfds_name")
    return [prediction.images_file(None, tfds_name, tfds_split, data_dir)]


@task(name="predict_images")
def predict_images(run_dir: str, images: list[str], output: str, table: str | None = None) -> str:
    """Ensemble probabilities, predictive entropy and mutual information to ``output``
    (.npz), one row per image to ``table`` (default: ``output`` as ``.csv``); publishes the
    first rows as the table artifact ``predictions`` and the summary as the Markdown
    artifact ``predictions-summary``. Returns ``output``."""
    _, npz_table = prediction.output_paths(run_dir, "", output, table)
    result, rows = prediction.predict_inputs(run_dir, images, output, npz_table)
    logger = get_run_logger()
    logger.info(
        "%d images: mean predictive entropy %.4f nats, mean mutual information %.4f nats -> %s",
        len(result["ensemble_probs"]),
        float(result["predictive_entropy"].mean()),
        float(result["mutual_information"].mean()),
        output,
    )
    summary = table_lib.summarize(rows)
    for line in [*table_lib.skipped_lines(rows), *table_lib.summary_lines(summary)]:
        logger.info("%s", line)
    logger.info("table: %s", npz_table)
    markdown = f"{table_lib.summary_markdown(summary)}\n- table: `{npz_table}`\n- arrays: `{output}`"
    create_table_artifact(
        key=TABLE_ARTIFACT,
        table=table_lib.head_records(rows),
        description=f"The first {min(len(rows), table_lib.HEAD_ROWS)} of {len(rows)} rows of {npz_table}",
    )
    create_markdown_artifact(key=SUMMARY_ARTIFACT, markdown=markdown, description="The predictions' summary")
    return output
