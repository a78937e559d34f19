"""Prefect task: train (or resume) the ensemble; live progress artifact and terminal bar;
wraps :func:`ensemble_core.runs.train`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from tqdm.auto import tqdm

from ensemble_core import runs
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from tasks import TRANSIENT_RETRIES

PROGRESS_KEY = "training-progress"
PROGRESS_INTERVAL_S = 10.0  # at most one progress-artifact update per 10 s of training


@task(name="train_ensemble", **TRANSIENT_RETRIES)
def train_members(config: PipelineConfig, dataset: DatasetInfo, keys: dict, run_dir: str) -> runs.TrainingSummary:
    """Train ``config.ensemble.size`` members; returns the training summary dict."""
    logger = get_run_logger()
    total = config.train.epochs
    artifact_id = create_progress_artifact(
        progress=0.0, key=PROGRESS_KEY, description=f"Training {config.ensemble.size} members"
    )
    # A bar only on a terminal: under a worker stderr is a pipe, which breaks if the worker dies.
    bar = tqdm(total=total, desc="epochs", unit="epoch", disable=not sys.stderr.isatty())
    last = [0.0]

    def on_step(epoch: int, step: int, steps: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_INTERVAL_S:  # each update is a blocking call to the Prefect API
            last[0] = now
            update_progress_artifact(artifact_id, progress=100.0 * (epoch + (step + 1) / steps) / total)

    def on_epoch(record: dict) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{sum(record['train_loss']) / len(record['train_loss']):.4f}")
        logger.info(
            "epoch %d/%d train loss per member %s, accuracy %s",
            record["epoch"],
            total,
            [round(x, 4) for x in record["train_loss"]],
            [round(x, 4) for x in record["train_accuracy"]],
        )

    try:
        summary = runs.train(config, dataset, keys, Path(run_dir), on_step=on_step, on_epoch=on_epoch)
    finally:
        bar.close()
    update_progress_artifact(artifact_id, progress=100.0)
    if summary.resumed_from is not None:
        logger.info("resumed from the checkpoint of epoch %d", summary.resumed_from)
    logger.info(
        "trained on %s (%d devices, mesh %s, strategy %s): compile %.2f s, train %.1f s",
        summary.backend,
        summary.devices,
        summary.mesh,
        summary.strategy,
        summary.timing.compile_seconds,
        summary.timing.train_seconds,
    )
    return summary
