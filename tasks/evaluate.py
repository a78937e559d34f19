"""Prefect task: vmapped evaluation of every member; writes predictions.npz."""

from __future__ import annotations

from prefect import get_run_logger, task

from ensemble_core import pipeline
from ensemble_core.config import PipelineConfig
from tasks import TRANSIENT_RETRIES


@task(name="evaluate", **TRANSIENT_RETRIES)
def evaluate(config: PipelineConfig, dataset: dict, run_dir: str) -> dict:
    """Score the latest checkpoint on the test split; returns the metrics dict."""
    result = pipeline.evaluate(config, dataset, run_dir)
    e, m = result["ensemble"], result["member_mean"]
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
