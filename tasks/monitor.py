"""Prefect tasks of the monitor flow, thin wrappers over :mod:`ensemble_core.runs.monitoring`:
plan the night (every check before the model runs), score the drop, publish what it found.

Events (resource: the champion's dataset, ``ensemble-pipeline.data.<dataset>``, labelled
``ensemble-pipeline.source: monitor``, so that the ``retrain-on-drift`` automation of
:mod:`flows.automations` reacts to the monitor's ``data.drift`` and never to the one a
training run emits before it trains):

- ``ensemble.monitored`` after every night: the estimate, the p-values, the verdict;
- ``data.drift`` when a drift test rejects at ``alpha`` (Holm): the same payload plus
  ``output_dir`` and ``retrain_config`` (the run's own config), what the automation's
  ``train-ensemble`` run is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.events import emit_event

from ensemble_core.runs.monitoring import drop, history, monitor
from ensemble_core.runs.prediction.files import run_meta

#: The artifacts a night publishes: its report, and the history across nights.
REPORT_ARTIFACT, HISTORY_ARTIFACT = "monitoring-night", "monitoring-history"
MONITORED_EVENT, DRIFT_EVENT = "ensemble.monitored", "data.drift"
#: The resource label that tells the monitor's events from the training flow's.
SOURCE_LABEL, SOURCE = "ensemble-pipeline.source", "monitor"


@task(name="plan_night")
def plan_night(
    images: list[str], run_dir: str | None, output_dir: str, alpha: float, estimator: str, night: str | None
) -> monitor.MonitorPlan:
    """:func:`ensemble_core.runs.monitoring.monitor.preflight`: the run, the night's id and
    paths; refuses bad input in one line before the model runs."""
    plan = monitor.preflight(images, run_dir, output_dir, alpha, estimator, night)
    get_run_logger().info("night %s: run %s -> %s", plan.night, plan.run_dir, plan.record.parent)
    return plan


@task(name="score_drop")
def score_drop(plan: monitor.MonitorPlan, images: list[str], alpha: float, estimator: str) -> dict[str, Any]:
    """:func:`ensemble_core.runs.monitoring.monitor.monitor_drop`: the night's record, written
    with its report, the history row and the history plot."""
    record = monitor.monitor_drop(plan, images, alpha, estimator)
    logger = get_run_logger()
    for line in drop.summary_lines(record):
        logger.info("%s", line)
    return record


def event_payload(record: dict[str, Any], plan: monitor.MonitorPlan) -> dict[str, Any]:
    """What the night's events carry: the figures, where the champion lives (``output_dir``,
    absolute) and ``retrain_config`` (:func:`ensemble_core.runs.monitoring.monitor.retrain_config`:
    what a retraining trains)."""
    return {
        "night": record["night"],
        "champion_run": record["champion_run"],
        "n_images": record["n_images"],
        "estimator": record["accuracy"]["estimator"],
        "estimate": record["accuracy"]["estimate"],
        "p_values": drop.p_values(record),
        "drifted": record["drifted"],
        "alpha": record["alpha"],
        "abstention_rate": record["abstention_rate"],
        "report": record["report"],
        "output_dir": str(Path(plan.output_dir).absolute()),
        "retrain_config": monitor.retrain_config(plan),
    }


@task(name="publish_night")
def publish_night(record: dict[str, Any], plan: monitor.MonitorPlan) -> None:
    """The night's report (Markdown artifact ``monitoring-night``), the history across
    nights (table artifact ``monitoring-history``), the event ``ensemble.monitored`` and,
    when a drift test rejected, ``data.drift``."""
    create_markdown_artifact(
        key=REPORT_ARTIFACT,
        markdown=drop.report_markdown(record) + f"\n- history plot: `{history.monitoring_dir(plan.output_dir)}/"
        f"{history.PLOT_FILE}`\n",
        description=f"Night {record['night']}: estimated accuracy, drift tests, decisions, classes",
    )
    rows = history.read_history(plan.output_dir)
    create_table_artifact(
        key=HISTORY_ARTIFACT,
        table=[
            {
                "night": r["night"],
                "images": r["n_images"],
                "estimated_accuracy": round(r["estimate"], 4),
                "estimator": r["estimator"],
                **{f"p_{k}": float(f"{v:.3g}") for k, v in r.get("p_values", {}).items()},
                "drifted": r["drifted"],
                "abstention_rate": None if r.get("abstention_rate") is None else round(r["abstention_rate"], 4),
            }
            for r in rows
        ],
        description=f"Every monitored night of {plan.output_dir}, oldest first",
    )
    dataset = run_meta(plan.run_dir)["dataset"]["name"]
    resource = {
        "prefect.resource.id": f"ensemble-pipeline.data.{dataset}",
        "prefect.resource.name": dataset,
        SOURCE_LABEL: SOURCE,
    }
    payload = event_payload(record, plan)
    emit_event(event=MONITORED_EVENT, resource=resource, payload=payload)
    logger = get_run_logger()
    if record["drifted"]:
        emit_event(event=DRIFT_EVENT, resource=resource, payload=payload)
        logger.warning("data.drift: %s", drop.summary_lines(record)[2])
