"""Training progress as Prefect shows it: a progress artifact, a terminal bar, log lines.

:func:`train_with_progress` gives a training call the ``on_step``/``on_epoch`` hooks of
:class:`ensemble_core.runs.training.trainer.Hooks` that keep the task run's progress artifact
(key ``training-progress``, or ``training-progress-group-<g>`` for member group g) up to
date, and logs one line per epoch and one summary line at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from tqdm.auto import tqdm

from ensemble_core import runs
from ensemble_core.config import PipelineConfig
from ensemble_core.ensemble_setup import group_size
from tasks.background_api import BackgroundSender

PROGRESS_KEY = "training-progress"
PROGRESS_INTERVAL_S = 10.0  # at most one progress-artifact update per 10 s of training


def train_with_progress(
    config: PipelineConfig,
    group: int | None,
    train: Callable[..., runs.TrainingSummary],
    key: str = PROGRESS_KEY,
) -> runs.TrainingSummary:
    """``train(on_step=..., on_epoch=...)`` with a progress artifact (``key``, plus
    ``-group-<g>`` for member group g), a terminal bar and one log line per epoch, in the
    current task run; ``group`` None for the whole ensemble."""
    logger = get_run_logger()
    total = config.train.epochs
    members = config.ensemble.size if group is None else group_size(config)
    first = 0 if group is None else group * members
    what = f"{members} members" if group is None else f"members {first}..{first + members - 1} (group {group})"
    artifact_id: Any = create_progress_artifact(
        progress=0.0,
        key=key if group is None else f"{key}-group-{group}",
        description=f"Training {what}",
    )
    # A bar only on a terminal: under a worker stderr is a pipe, which breaks if the worker dies.
    bar = tqdm(total=total, desc="epochs", unit="epoch", disable=not sys.stderr.isatty())
    last = [0.0]
    sender = BackgroundSender(logger)

    def on_step(epoch: int, step: int, steps: int) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_INTERVAL_S and sender.idle():
            last[0] = now
            sender.send(update_progress_artifact, artifact_id, progress=100.0 * (epoch + (step + 1) / steps) / total)

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
        summary = train(on_step=on_step, on_epoch=on_epoch)
        sender.send(update_progress_artifact, artifact_id, progress=100.0)  # after any update in flight
    finally:
        bar.close()
        sender.close()
    _log_summary(logger, what, summary)
    return summary


def _log_summary(logger, what: str, summary: runs.TrainingSummary) -> None:
    if summary.resumed_from is not None:
        logger.info("resumed from the checkpoint of epoch %d", summary.resumed_from)
    where = summary.topology[0]
    logger.info(
        "trained %s on %s (%d devices, mesh %s, strategy %s) in process %d on %s%s: compile %.2f s, train %.1f s",
        what,
        summary.backend,
        summary.devices,
        summary.mesh,
        summary.strategy,
        where["pid"],
        where["host"],
        f" (Dask worker {where['worker']})" if where["worker"] else "",
        summary.timing.compile_seconds,
        summary.timing.train_seconds,
    )
