"""Prefect task: the select stage (the members of the run's ensemble and its temperature,
chosen on the validation split); wraps :func:`ensemble_core.runs.select`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from ensemble_core import runs
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.runs.storage.records import read_decisions
from tasks import TRANSIENT_RETRIES


@task(name="select_members", **TRANSIENT_RETRIES)
def select_members(config: PipelineConfig, dataset: DatasetInfo, run_dir: str) -> dict[str, Any] | None:
    """Choose the ensemble and write ``selection.json``; logs what was chosen (None: no
    validation split, the ensemble is every healthy member)."""
    record = runs.select(config, dataset, run_dir)
    logger = get_run_logger()
    rules = read_decisions(runs.RunDir(Path(run_dir)))
    log_decisions(logger, None if rules is None else rules.to_dict())
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


def log_decisions(logger, record: dict | None) -> None:
    """One line for the prediction sets and one for the abstention threshold the select
    stage fitted (``decisions.json``), a warning when the target risk cannot be guaranteed."""
    if record is None:
        return
    sets = record["prediction_sets"][record["method"]]
    logger.info(
        "prediction sets: %s at alpha %g (coverage >= %g), fitted on the %s split (%d examples)",
        record["method"].upper(),
        sets["alpha"],
        1 - sets["alpha"],
        record["split"],
        record["num_examples"],
    )
    rule = record["abstention"]
    if rule["feasible"]:
        logger.info(
            "abstention on %s: risk <= %g with confidence %g, accepting %.1f%% of the %s split",
            rule["criterion"],
            rule["target_risk"],
            1 - rule["delta"],
            100 * rule["coverage"],
            record["split"],
        )
    else:
        logger.warning(
            "abstention.target_risk=%g cannot be guaranteed on %d %s examples (smallest risk bound %.4f): the "
            "ensemble abstains on every input; fix: raise abstention.target_risk or data.calibration_fraction",
            rule["target_risk"],
            record["num_examples"],
            record["split"],
            rule["risk_bound"],
        )
