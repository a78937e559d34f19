"""Prefect task: prepare the dataset (cached across runs on its inputs and source)."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import INPUTS, TASK_SOURCE

from ensemble_core import pipeline
from ensemble_core.config import DataConfig
from tasks import TRANSIENT_RETRIES


@task(name="prepare_dataset", cache_policy=INPUTS + TASK_SOURCE, persist_result=True, **TRANSIENT_RETRIES)
def prepare_dataset(data: DataConfig) -> dict:
    """Prepare ``data.name`` as array_record files; returns the dataset info dict."""
    info = pipeline.prepare_dataset(data)
    get_run_logger().info(
        "dataset %s: %d train / %d test, %d classes, images %s, in %s",
        info["name"],
        info["num_train"],
        info["num_test"],
        info["num_classes"],
        tuple(info["image_shape"]),
        info["data_dir"],
    )
    return info
