"""Where member groups run: the Prefect task runner of ``distributed.task_runner``, the
mapper that submits the groups to it, and the Dask worker a group runs on (its address,
its CPU core). Everything Dask-specific of the project is here, not in ``ensemble_core``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence

from prefect import get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from ensemble_core.config import PipelineConfig

# The caller waits for its groups in slices of this many seconds. Python runs a signal
# handler only when the main thread executes bytecode, and the kernel may deliver a
# process's SIGTERM to another thread (a group's, on the thread pool) while the main thread
# sleeps in an untimed wait: the stop request was then recorded only when every group had
# trained to its end (tests/test_stop_signals.py, CI of stop 54).
WAIT_SLICE_S = 0.2


def submit_each(task, calls: Sequence[tuple]) -> list:
    """The mapper of :func:`ensemble_core.runs.training.groups.map_groups` for a Prefect task:
    submit ``task(*args)`` for every call to the flow's task runner, then wait for all
    (results in call order; then the first failure, in call order, raises).

    Every group ends before anything raises: when one group stops or fails, the others
    finish their own stop (a checkpoint at their step) rather than being killed
    mid-write when the task runner shuts down (a Dask cluster's workers are)."""
    futures = [task.submit(*args) for args in calls]
    done = [threading.Event() for _ in futures]
    for future, event in zip(futures, done, strict=True):
        future.add_done_callback(lambda _future, event=event: event.set())
    for event in done:
        while not event.wait(WAIT_SLICE_S):  # each slice lets a pending signal handler run
            pass
    return [f.result() for f in futures]


def dask_worker():
    """The ``distributed.Worker`` running the caller, or None outside a Dask worker."""
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def scheduler_lost() -> Callable[[], bool]:
    """A check for every training step: True once the Dask worker running the caller is
    closing, as a worker does when its scheduler connection breaks (e.g. its host cut
    off, after ``distributed.comm.timeouts.tcp``). The scheduler then runs the task
    again elsewhere, so it must stop and let go of the group's lock. Outside a Dask
    worker: always False."""
    worker = dask_worker()
    if worker is None:
        return lambda: False
    from distributed.core import Status

    return lambda: worker.status in (Status.closing, Status.closed, Status.failed)


def pin_to_core(index: int) -> int:
    """Pin every thread of this process to CPU core ``index`` mod the cores it may use
    (Linux; threads started later inherit it). Returns the core."""
    cores = sorted(os.sched_getaffinity(0))
    core = cores[index % len(cores)]
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that just ended
            os.sched_setaffinity(int(tid), {core})
    return core


def place_group(config: PipelineConfig) -> str | None:
    """In a worker of the run's own local Dask cluster with ``distributed.pin_cores``:
    pin worker k to CPU core k. Returns the Dask worker's address (None outside one)."""
    dist = config.distributed
    worker = dask_worker()
    local_cluster = dist.task_runner == "dask" and dist.address is None  # its workers are named 0..n-1
    if worker is not None and local_cluster and dist.pin_cores and str(worker.name).isdigit():
        core = pin_to_core(int(worker.name))
        get_run_logger().info("Dask worker %s pinned to CPU core %d", worker.name, core)
    return None if worker is None else worker.address


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
        from tasks.cluster import client_security

        security = client_security(config)  # None for tcp://
        return DaskTaskRunner(address=dist.address, client_kwargs={} if security is None else {"security": security})
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
