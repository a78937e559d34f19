"""Prefect task: report.json, report.md, plots, and markdown/table artifacts; wraps
:func:`ensemble_core.runs.write_report`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from ensemble_core import runs
from ensemble_core.data import DatasetInfo
from ensemble_core.runs.report import data as report_data
from ensemble_core.runs.report import write as report_lib
from ensemble_core.runs.report.stratify import stratification_table
from tasks import TRANSIENT_RETRIES

REPORT_KEY = "ensemble-report"
SNAPSHOT_KEY = "ensemble-data-snapshot"
MEMBERS_KEY = "ensemble-members"
POOL_KEY = "ensemble-pool"
STRATIFIED_POOL_KEY = "ensemble-stratified-pool"
#: The test split's class-level tables (:func:`ensemble_core.runs.report.write.class_level_tables`).
PER_CLASS_KEY = "ensemble-per-class"
CONFUSION_MATRIX_KEY = "ensemble-confusion-matrix"
CLASS_LEVEL_ARTIFACTS = {
    "per_class": (PER_CLASS_KEY, "The ensemble per class on the test split: count, accuracy (recall), NLL, ECE"),
    "confusion_matrix": (
        CONFUSION_MATRIX_KEY,
        "The ensemble's confusion matrix on the test split: one row per true class, one column of counts per "
        "predicted class",
    ),
}


def evaluation_key(name: str) -> str:
    """The table artifact key of evaluator ``name``: ``ensemble-eval-<name>`` (dashes:
    Prefect keys take lowercase letters, digits and dashes)."""
    return "ensemble-eval-" + name.replace("_", "-")


@task(name="publish_report", **TRANSIENT_RETRIES)
def publish_report(
    run_name: str,
    config: dict,
    training: runs.TrainingSummary,
    evaluation: runs.Evaluation,
    run_dir: str,
    promotion: runs.PromotionDecision | None = None,
    dataset: DatasetInfo | None = None,
    drift: runs.DriftReport | None = None,
    stratification: runs.StratificationSummary | None = None,
    selection: dict[str, Any] | None = None,
    timing: dict[str, Any] | None = None,
) -> str:
    """Write the report files and publish them as artifacts; returns report.json's path.
    ``timing``: the run's stage timings so far (:func:`ensemble_core.runs.write_report`)."""
    rep = runs.write_report(
        run_name,
        config,
        training,
        evaluation,
        Path(run_dir),
        promotion,
        dataset,
        drift,
        stratification,
        selection,
        timing,
    )
    create_markdown_artifact(
        markdown=report_lib.render_markdown(rep, plots=False),
        key=REPORT_KEY,
        description=f"Ensemble report of run {run_name}",
    )
    create_table_artifact(
        table=report_lib.member_table(rep), key=MEMBERS_KEY, description="Per-member vs ensemble test metrics"
    )
    if rep.get("data_snapshot"):
        create_table_artifact(
            table=report_data.snapshot_rows(rep["data_snapshot"]),
            key=SNAPSHOT_KEY,
            description="The data snapshot this run trained on: fingerprint, source, counts per split and class",
        )
    if rep.get("pool"):
        create_table_artifact(
            table=report_lib.pool_table(rep),
            key=POOL_KEY,
            description="The trained pool: each member's hyperparameters, best and stop epoch, validation NLL, "
            "and how many times the ensemble selected it",
        )
    if rep.get("stratification"):
        create_table_artifact(
            table=stratification_table(rep),
            key=STRATIFIED_POOL_KEY,
            description="The stratified pool of the hyper-deep ensemble: each member's setting (search-pool "
            "member), initialisation, best and stop epoch, validation NLL, and how many times the final "
            "selection picked it",
        )
    for table, rows in report_lib.class_level_tables(rep).items():
        key, description = CLASS_LEVEL_ARTIFACTS[table]
        create_table_artifact(table=rows, key=key, description=description)
    for name, rows in report_lib.evaluator_tables(rep).items():
        create_table_artifact(
            table=rows,
            key=evaluation_key(name),
            description=f"Evaluator {name}: ensemble vs members (report.json -> evaluations.{name})",
        )
    path = runs.RunDir(Path(run_dir)).report_json
    get_run_logger().info("report written to %s", path)
    return str(path)
