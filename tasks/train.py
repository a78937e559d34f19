"""Prefect tasks of the training stage, thin wrappers over :mod:`ensemble_core.runs.training.groups`:
the whole ensemble in one task run, or each member group in its own task run (on the
configured task runner, :mod:`tasks.runners`) and then gathered; progress as Prefect
shows it is :mod:`tasks.progress`."""

from __future__ import annotations

import signal
from pathlib import Path

from prefect import flow, get_run_logger, task

from ensemble_core import runs, stopping
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.errors import PreemptedError, resume_fix
from tasks import TRANSIENT_RETRIES, without_introspection
from tasks.progress import train_with_progress
from tasks.runners import place_group, scheduler_lost, submit_each, task_runner

__all__ = [
    "gather_members",
    "train_member_group",
    "train_members",
    "train_on_runner",
    "train_stage",
]


@task(name="train_members", **TRANSIENT_RETRIES)
def train_members(config: PipelineConfig, dataset: DatasetInfo, run_dir: str) -> runs.TrainingSummary:
    """Train ``config.ensemble.size`` members (one process, or one program across JAX
    processes); returns the training summary."""
    return train_with_progress(config, None, lambda **hooks: runs.train_groups(config, dataset, run_dir, **hooks))


@task(name="train_member_group", task_run_name="train_member_group-{group}", **TRANSIENT_RETRIES)
def train_member_group(config: PipelineConfig, dataset: DatasetInfo, run_dir: str, group: int) -> runs.TrainingSummary:
    """Train (or resume) member group ``group`` under ``run_dir/groups/<group>/``, in
    whichever process the task runner gives it; returns the group's training summary.

    Stops at its next step, after a checkpoint, on a stop relayed from the flow or when
    its Dask worker has lost the scheduler (:func:`tasks.runners.scheduler_lost`: the
    scheduler runs this task again on another worker, which waits for the group's lock,
    ``distributed.group_lock_wait_s``, and resumes from that checkpoint)."""
    worker = place_group(config)
    relayed = stopping.file_requested(runs.RunDir(Path(run_dir)).stop_request)  # a stop relayed from the flow
    lost = scheduler_lost()

    def stop() -> bool:
        return relayed() or lost()

    def train(**hooks):
        return runs.train(config, dataset, run_dir, group=group, worker=worker, should_stop=stop, **hooks)

    return train_with_progress(config, group, train)


@task(name="gather_members", **TRANSIENT_RETRIES)
def gather_members(
    config: PipelineConfig, dataset: DatasetInfo, run_dir: str, summaries: list[runs.TrainingSummary]
) -> runs.TrainingSummary:
    """Join the groups' final checkpoints into the run's checkpoint (:func:`ensemble_core.runs.gather_groups`)."""
    summary = runs.gather_groups(config, dataset, run_dir, summaries)
    get_run_logger().info(
        "gathered %d members from %d groups at step %s",
        config.ensemble.size,
        config.distributed.member_groups,
        summary.checkpoint_step,
    )
    return summary


@flow(name="train-member-groups", log_prints=True)
def _member_groups(config: PipelineConfig, dataset: DatasetInfo, run_dir: str) -> runs.TrainingSummary:
    """:func:`ensemble_core.runs.train_groups` with one ``train_member_group`` task run per
    group, submitted to this flow's task runner, and the ``gather_members`` task.

    A subflow's engine puts Prefect's own SIGTERM handler back for its duration (one that
    raises wherever the main thread is, so a stop can be lost in a garbage-collection
    callback, and the groups' threads never see it): the project's stop requests
    (:mod:`ensemble_core.stopping`) are installed again here, and relayed through the run
    directory to groups on Dask workers (other processes, which the signal never
    reaches), so each group stops at its next step after a checkpoint."""
    with stopping.stop_signals(), stopping.relay_to_file(runs.RunDir(Path(run_dir)).stop_request):
        return runs.train_groups(
            config, dataset, run_dir, group_call=train_member_group, gather=gather_members, mapper=submit_each
        )


def log_members(config: PipelineConfig, dataset: DatasetInfo) -> None:
    """Log, in the flow run, the member network, its API (Linen or NNX) and how it is put
    in training and inference mode (:func:`ensemble_core.train.forward.convention`), and how the members differ: their
    keys' derivation, and the hyperparameters ``ensemble.search`` draws for each."""
    from ensemble_core.networks import build_network
    from ensemble_core.train.forward import convention

    logger = get_run_logger()
    model = build_network(config, dataset.num_classes)
    logger.info("member network %s, %s", config.model.name, convention(model))
    e = config.ensemble.size
    logger.info("seed %d -> %d members, member i keyed by fold_in(fold_in(key(seed), purpose), i)", config.seed, e)
    searched = sorted(config.ensemble.search or {})
    if searched:
        hyperparameters = config.member_hyperparameters(e)
        logger.info("ensemble.search varies %s per member, drawn from (seed, i)", ", ".join(searched))
        for i in range(e):
            logger.info("member %d: %s", i, {k: hyperparameters[i][k] for k in searched})


def train_stage(config: PipelineConfig, dataset: DatasetInfo, run_dir: str) -> runs.TrainingSummary:
    """The flow's training stage: the ``train_members`` task with one member group, else
    the ``train-member-groups`` subflow on the configured task runner
    (:func:`train_on_runner`), after :func:`log_members`."""
    log_members(config, dataset)
    return train_on_runner(config, dataset, run_dir)


def train_on_runner(config: PipelineConfig, dataset: DatasetInfo, run_dir: str) -> runs.TrainingSummary:
    """The ``train_members`` task with one member group, else the ``train-member-groups``
    subflow on the configured task runner (the training stage's, and a stratified pool's
    with several member groups)."""
    if config.distributed.member_groups == 1:
        return without_introspection(train_members)(config, dataset, run_dir)
    from prefect.exceptions import TerminationSignal

    try:
        return _member_groups.with_options(task_runner=task_runner(config))(config, dataset, run_dir)
    except TerminationSignal as err:
        # While the subflow's engine starts and ends (outside its body, where the groups
        # train under the project's handler) Prefect's own SIGTERM bridge is installed
        # (prefect.utilities.engine.capture_sigterm) and raises this; the groups'
        # checkpoints are what they were, so this is a stop like any other.
        raise PreemptedError(
            f"stopped by {signal.Signals(err.signal).name} while the member groups started or ended; their "
            "checkpoints are kept",
            fix=resume_fix(Path(run_dir).name),
        ) from None
