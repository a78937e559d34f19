"""Prefect task: prepare the dataset as a data snapshot, cached across runs on its inputs,
its source and the fingerprint of the data it is prepared from; wraps
:func:`ensemble_core.runs.prepare`."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CacheKeyFnPolicy

from ensemble_core import runs
from ensemble_core.config import DataConfig
from ensemble_core.data import DatasetInfo
from tasks import TRANSIENT_RETRIES


def snapshot_key(context: Any, parameters: dict[str, Any]) -> str:
    """The data snapshot's fingerprint, part of the task's cache key: replaced source files
    are a cache miss although the config is the same. A source that cannot be
    fingerprinted gives a key of its own, never a hit: the task runs and raises the
    one-line error."""
    cfg: DataConfig = parameters["data"]
    try:
        return runs.dataset_fingerprint(cfg)
    except Exception:  # noqa: BLE001  (the task itself raises the right one-line error)
        return f"unfingerprinted-{uuid.uuid4()}"


@task(
    name="prepare_dataset",
    cache_policy=INPUTS + TASK_SOURCE + CacheKeyFnPolicy(cache_key_fn=snapshot_key),
    persist_result=True,
    **TRANSIENT_RETRIES,
)
def prepare_dataset(data: DataConfig) -> DatasetInfo:
    """Prepare ``data.name`` as a data snapshot; returns its :class:`DatasetInfo`."""
    info = runs.prepare(data)
    snapshot = info.snapshot
    names = ", ".join(info.class_names)
    get_run_logger().info(
        "dataset %s snapshot %s: %d train / %d test, %d classes (%s), images %s, in %s%s",
        info.name,
        snapshot.fingerprint if snapshot else "-",
        info.num_train,
        info.num_test,
        info.num_classes,
        names if len(names) <= 200 else names[:200] + "...",
        tuple(info.image_shape),
        info.tfds_data_dir,
        f"; {len(snapshot.skipped_files)} undecodable file(s) left out" if snapshot and snapshot.skipped_files else "",
    )
    return info


def prepare_stage(data: DataConfig) -> DatasetInfo:
    """The flow's prepare stage: :func:`prepare_dataset`, prepared again (cache refreshed)
    when a cached result names a snapshot directory that retention has removed since."""
    info = prepare_dataset(data)
    if not Path(info.data_dir).is_dir():
        info = prepare_dataset.with_options(refresh_cache=True)(data)
    return info
