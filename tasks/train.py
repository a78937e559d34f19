"""Prefect tasks: train (or resume) the ensemble, or each member group of it and then gather
them; live progress artifacts and a terminal bar; wrap :func:`ensemble_core.runs.train`
and :func:`ensemble_core.runs.gather_groups`."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.task_runners import ThreadPoolTaskRunner
from tqdm.auto import tqdm

from ensemble_core import runs
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.runs.training import dask_worker, group_keys
from ensemble_core.setup import group_size
from tasks import TRANSIENT_RETRIES

PROGRESS_KEY = "training-progress"
PROGRESS_INTERVAL_S = 10.0  # at most one progress-artifact update per 10 s of training


def _train_with_progress(
    config: PipelineConfig, dataset: DatasetInfo, keys: dict, run_dir: str, group: int | None
) -> runs.TrainingSummary:
    """:func:`ensemble_core.runs.train` with a progress artifact, a terminal bar and one log
    line per epoch, in the current task run."""
    logger = get_run_logger()
    total = config.train.epochs
    members = config.ensemble.size if group is None else group_size(config)
    first = 0 if group is None else group * members
    what = f"{members} members" if group is None else f"members {first}..{first + members - 1} (group {group})"
    artifact_id = create_progress_artifact(
        progress=0.0,
        key=PROGRESS_KEY if group is None else f"{PROGRESS_KEY}-group-{group}",
        description=f"Training {what}",
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
        if group is None:  # the whole ensemble: one process, or one program across JAX processes
            summary = runs.train_groups(config, dataset, keys, Path(run_dir), on_step=on_step, on_epoch=on_epoch)
        else:
            summary = runs.train(config, dataset, keys, Path(run_dir), group=group, on_step=on_step, on_epoch=on_epoch)
    finally:
        bar.close()
    update_progress_artifact(artifact_id, progress=100.0)
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
    return summary


@task(name="train_ensemble", **TRANSIENT_RETRIES)
def train_members(config: PipelineConfig, dataset: DatasetInfo, keys: dict, run_dir: str) -> runs.TrainingSummary:
    """Train ``config.ensemble.size`` members; returns the training summary."""
    return _train_with_progress(config, dataset, keys, run_dir, None)


def pin_to_core(index: int) -> int:
    """Pin every thread of this process to CPU core ``index`` mod the cores it may use
    (Linux; threads started later inherit it). Returns the core."""
    cores = sorted(os.sched_getaffinity(0))
    core = cores[index % len(cores)]
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
        except OSError:  # a thread that just ended
            pass
    return core


@task(name="train_member_group", task_run_name="train_member_group-{group}", **TRANSIENT_RETRIES)
def train_member_group(
    config: PipelineConfig, dataset: DatasetInfo, keys: dict, run_dir: str, group: int
) -> runs.TrainingSummary:
    """Train (or resume) member group ``group`` under ``run_dir/groups/<group>/``, in
    whichever process the task runner gives it; returns the group's training summary."""
    dist = config.distributed
    worker = dask_worker()
    local_cluster = dist.task_runner == "dask" and dist.address is None  # its workers are named 0..n-1
    if worker is not None and local_cluster and dist.pin_cores and str(worker.name).isdigit():
        core = pin_to_core(int(worker.name))
        get_run_logger().info("Dask worker %s pinned to CPU core %d", worker.name, core)
    return _train_with_progress(config, dataset, keys, run_dir, group)


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


def task_runner(config: PipelineConfig):
    """The Prefect task runner the member groups run on (``distributed.task_runner``).

    'local': one group after another in this process. 'dask': prefect-dask's
    ``DaskTaskRunner`` on the scheduler at ``distributed.address`` (TLS with the
    configured certificates for a tls:// address), or on a local cluster of worker
    processes (one thread each) that listens on loopback only, with temporary TLS
    certificates (mutual authentication: a client without them is refused) and no
    dashboard.
    """
    dist = config.distributed
    if dist.task_runner == "local":
        return ThreadPoolTaskRunner(max_workers=1)
    from prefect_dask import DaskTaskRunner

    if dist.address is not None:
        client_kwargs = {}
        if dist.address.startswith("tls://"):
            from distributed.security import Security

            client_kwargs["security"] = Security(
                tls_ca_file=dist.tls_ca_file,
                tls_client_cert=dist.tls_cert,
                tls_client_key=dist.tls_key,
                require_encryption=True,
            )
        return DaskTaskRunner(address=dist.address, client_kwargs=client_kwargs)
    workers = dist.workers or min(dist.member_groups, os.cpu_count() or 1)
    return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=local_cluster_kwargs(workers))


def local_cluster_kwargs(workers: int) -> dict:
    """``distributed.LocalCluster`` arguments of a run's own cluster: ``workers`` worker
    processes of one thread each, everything on loopback, no dashboard, and TLS with
    temporary self-signed certificates between every party (a client or worker without
    them is refused)."""
    return {
        "n_workers": workers,
        "threads_per_worker": 1,
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": None,
        "security": True,
    }


@flow(name="train-member-groups", log_prints=True)
def _member_groups(config: PipelineConfig, dataset: DatasetInfo, keys: dict, run_dir: str) -> runs.TrainingSummary:
    """Submit one ``train_member_group`` task run per group to this flow's task runner,
    wait for all of them, then gather the members."""
    futures = [
        train_member_group.submit(config, dataset, group_keys(config, keys, g), run_dir, g)
        for g in range(config.distributed.member_groups)
    ]
    summaries = [f.result() for f in futures]
    return gather_members(config, dataset, run_dir, summaries)


def train_stage(config: PipelineConfig, dataset: DatasetInfo, keys: dict, run_dir: str) -> runs.TrainingSummary:
    """The flow's training stage: the ``train_ensemble`` task with one member group, else
    the ``train-member-groups`` subflow on the configured task runner."""
    if config.distributed.member_groups == 1:
        return train_members(config, dataset, keys, run_dir)
    return _member_groups.with_options(task_runner=task_runner(config))(config, dataset, keys, run_dir)
