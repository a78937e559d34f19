"""Prefect tasks of the stratification stage (hyper-deep ensembles), thin wrappers over
:mod:`ensemble_core.runs.ensemble.stratify`: ``select_settings`` (the first selection from the
search pool) and ``stratify_members`` (the stratified pool, with its progress artifact
``stratification-progress``), or the member-groups subflow of the training stage."""

from __future__ import annotations

from prefect import get_run_logger, task

from ensemble_core import runs
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.runs.ensemble.stratify import first_selection
from ensemble_core.stratification import StratificationPlan
from tasks import TRANSIENT_RETRIES
from tasks.progress import train_with_progress
from tasks.train import train_on_runner

STRATIFICATION_PROGRESS_KEY = "stratification-progress"


@task(name="select_settings", **TRANSIENT_RETRIES)
def select_settings(config: PipelineConfig, dataset: DatasetInfo, run_dir: str) -> StratificationPlan:
    """The first selection from the search pool (:func:`ensemble_core.runs.ensemble.stratify.first_selection`)."""
    plan = first_selection(config, dataset, run_dir)
    first = plan.first_selection
    get_run_logger().info(
        "first selection: members %s (validation NLL %.4f); stratifying %d settings %s x %d initialisations",
        first["members"],
        first["validation_nll"][-1],
        len(plan.settings),
        plan.settings,
        plan.inits,
    )
    return plan


@task(name="stratify_members", **TRANSIENT_RETRIES)
def stratify_members(config: PipelineConfig, dataset: DatasetInfo, run_dir: str) -> runs.TrainingSummary:
    """Train (or resume) the stratified pool ``config`` (one member group) under ``run_dir``."""

    def train(**hooks):
        return runs.train_groups(config, dataset, run_dir, **hooks)

    return train_with_progress(config, None, train, key=STRATIFICATION_PROGRESS_KEY)


def _train_pool(config: PipelineConfig, dataset: DatasetInfo, run_dir: str) -> runs.TrainingSummary:
    if config.distributed.member_groups == 1:
        return stratify_members(config, dataset, run_dir)
    return train_on_runner(config, dataset, run_dir)  # the groups' subflow, on the configured task runner


def stratify_stage(config: PipelineConfig, dataset: DatasetInfo, run_dir: str) -> runs.StratificationSummary:
    """The flow's stratification stage: the ``select_settings`` task, then the stratified
    pool's training (``stratify_members``, or one task run per member group)."""
    return runs.stratify(config, dataset, run_dir, train=_train_pool, select=select_settings)
