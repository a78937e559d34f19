"""Prefect tasks around retraining: nothing new since the champion (``ensemble.skipped``),
the drift signal (``data.drift``) and retention; wrap :mod:`ensemble_core.runs.champion.retraining`
and :func:`ensemble_core.runs.apply_retention`."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.events import emit_event

from ensemble_core import runs
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.runs.report import data as report_data
from tasks import TRANSIENT_RETRIES

SKIPPED_KEY = "ensemble-skipped"
DRIFT_KEY = "ensemble-drift"
RETENTION_KEY = "ensemble-retention"


def _data_resource(dataset: str) -> dict[str, str]:
    """The resource of the data events (``ensemble.skipped``, ``data.drift``): the dataset."""
    return {"prefect.resource.id": f"ensemble-pipeline.data.{dataset}", "prefect.resource.name": dataset}


@task(name="check_unchanged", **TRANSIENT_RETRIES)
def check_unchanged(config: PipelineConfig, dataset: DatasetInfo, output_dir: str) -> runs.SkipDecision | None:
    """``nightly.when_unchanged=skip`` and nothing new since the champion: emits
    ``ensemble.skipped`` and a markdown artifact saying so; returns the decision (None:
    train)."""
    decision = runs.unchanged_since_champion(config, dataset, output_dir)
    if decision is None:
        return None
    emit_event(  # about the data (nothing new in it), not about the champion's run: that run did nothing
        event="ensemble.skipped", resource=_data_resource(dataset.name), payload=decision.model_dump(mode="json")
    )
    create_markdown_artifact(
        markdown=f"# Nothing to train\n\n{decision.reason}.\n\nThe champion's report: `{decision.champion_run_dir}`.\n",
        key=SKIPPED_KEY,
        description="Why this run trained nothing",
    )
    get_run_logger().info(decision.reason)
    return decision


@task(name="detect_drift", **TRANSIENT_RETRIES)
def detect_drift(config: PipelineConfig, dataset: DatasetInfo, output_dir: str) -> runs.DriftReport:
    """The champion's view of the new data snapshot; emits ``data.drift`` (payload: the
    figures and the thresholds exceeded) when a ``nightly.drift`` threshold is exceeded,
    and publishes the figures as a table artifact."""
    drift = runs.detect_drift(config, dataset, output_dir)
    logger = get_run_logger()
    rows = report_data.drift_rows(drift.model_dump(mode="json"))
    if rows:
        create_table_artifact(
            table=rows,
            key=DRIFT_KEY,
            description=f"Champion {drift.champion_run} on the new data snapshot vs on its own test split",
        )
    if drift.drifted:
        emit_event(
            event="data.drift",
            resource=_data_resource(dataset.name),
            payload=drift.model_dump(mode="json"),
        )
        logger.warning("data.drift: %s", "; ".join(drift.exceeded))
    else:
        logger.info("drift: no threshold exceeded (%s)", "; ".join(drift.not_computed) or "all figures computed")
    return drift


@task(name="apply_retention", **TRANSIENT_RETRIES)
def apply_retention(config: PipelineConfig, output_dir: str) -> runs.RetentionReport | None:
    """The output directory's retention policy, after the run (:func:`ensemble_core.runs.retain`)."""
    report = runs.retain(config, output_dir)
    if report is not None:
        get_run_logger().info(report.summary())
        create_markdown_artifact(
            markdown=f"# Retention of `{output_dir}`\n\n{report.summary()}\n",
            key=RETENTION_KEY,
            description="What the retention policy kept, pruned and removed after this run",
        )
    return report
