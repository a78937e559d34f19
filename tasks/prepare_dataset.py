"""Prefect task: prepare the dataset (cached across runs on its inputs and source); wraps
:func:`ensemble_core.runs.prepare`."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import INPUTS, TASK_SOURCE

from ensemble_core import runs
from ensemble_core.config import DataConfig
from ensemble_core.data import DatasetInfo
from tasks import TRANSIENT_RETRIES


@task(name="prepare_dataset", cache_policy=INPUTS + TASK_SOURCE, persist_result=True, **TRANSIENT_RETRIES)
def prepare_dataset(data: DataConfig) -> DatasetInfo:
    """Prepare ``data.name`` as array_record files; returns its :class:`DatasetInfo`."""
    info = runs.prepare(data)
    get_run_logger().info(
        "dataset %s: %d train / %d test, %d classes, images %s, in %s",
        info.name,
        info.num_train,
        info.num_test,
        info.num_classes,
        tuple(info.image_shape),
        info.data_dir,
    )
    return info
