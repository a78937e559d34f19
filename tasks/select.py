"""Prefect task: the select stage (the members of the run's ensemble and its temperature,
chosen on the validation split); wraps :func:`ensemble_core.runs.select`."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from ensemble_core import runs
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from tasks import TRANSIENT_RETRIES


@task(name="select_members", **TRANSIENT_RETRIES)
def select_members(config: PipelineConfig, dataset: DatasetInfo, run_dir: str) -> dict[str, Any] | None:
    """Choose the ensemble and write ``selection.json``; logs what was chosen (None: no
    validation split, the ensemble is every healthy member)."""
    record = runs.select(config, dataset, run_dir)
    logger = get_run_logger()
    if record is None:
        logger.info("no validation split: the ensemble is every healthy member, without temperature scaling")
        return None
    logger.info(
        "ensemble of %d (%d distinct members %s), validation NLL %.4f on %d examples",
        len(record["members"]),
        record["distinct"],
        sorted(set(record["members"])),
        record["validation_nll"][-1],
        record["validation_examples"],
    )
    if record["temperature"] is not None:
        logger.info(
            "temperature T = %.4f: validation NLL %.4f -> %.4f",
            record["temperature"],
            record["validation_nll"][-1],
            record["validation_nll_temperature_scaled"],
        )
    return record
