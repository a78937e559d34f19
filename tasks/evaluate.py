"""Prefect task: every evaluator of ``eval.evaluators`` on the restored members; wraps
:func:`ensemble_core.runs.evaluate`."""

from __future__ import annotations

from prefect import get_run_logger, task

from ensemble_core import runs
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from tasks import TRANSIENT_RETRIES


@task(name="evaluate_members", **TRANSIENT_RETRIES)
def evaluate_members(config: PipelineConfig, dataset: DatasetInfo, run_dir: str) -> runs.Evaluation:
    """Score the latest checkpoint; logs the test split's headline figures."""
    result = runs.evaluate(config, dataset, run_dir)
    e, m = result.test["ensemble"], result.test["member_mean"]
    get_run_logger().info(
        "ensemble accuracy %.4f NLL %.4f Brier %.4f ECE %.4f (member mean: %.4f / %.4f / %.4f / %.4f)",
        e["accuracy"],
        e["nll"],
        e["brier"],
        e["ece"],
        m["accuracy"],
        m["nll"],
        m["brier"],
        m["ece"],
    )
    return result
