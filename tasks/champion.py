"""Prefect task: champion/challenger decision, its event, and the run-history table; wraps
:func:`ensemble_core.runs.promote`."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.events import emit_event

from ensemble_core import runs
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from tasks import TRANSIENT_RETRIES

HISTORY_KEY = "ensemble-run-history"


@task(name="compare_with_champion", **TRANSIENT_RETRIES)
def compare_with_champion(
    config: PipelineConfig,
    dataset: DatasetInfo,
    run_name: str,
    run_dir: str,
    evaluation: runs.Evaluation,
    output_dir: str,
) -> runs.PromotionDecision:
    """Promote this run if it is not worse than the champion; emits ``ensemble.promoted``
    or ``ensemble.rejected`` and republishes the run-history table artifact."""
    decision = runs.promote(config, dataset, run_name, run_dir, evaluation, output_dir)
    event = "ensemble.promoted" if decision.promoted else "ensemble.rejected"
    emit_event(
        event=event,
        resource={"prefect.resource.id": f"ensemble-pipeline.run.{run_name}", "prefect.resource.name": run_name},
        payload=decision.model_dump(mode="json", exclude={"history"}),
    )
    create_table_artifact(
        table=decision.history,
        key=HISTORY_KEY,
        description=f"Every run's ensemble test metrics and whether it was promoted ({output_dir})",
    )
    get_run_logger().info("%s: %s", event, decision.reason)
    return decision
