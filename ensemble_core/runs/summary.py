"""The rows of a training summary that describe members and processes.

:func:`member_records` (per member: hyperparameters, best epoch, early stop, health) and
:func:`where_trained` (per member group: host, process, devices, speed) are the
``members`` and ``topology`` of :class:`~ensemble_core.runs.results.TrainingSummary`;
:func:`images_per_s` is its throughput figure.
"""

from __future__ import annotations

import os
import socket

import jax

from ensemble_core.mesh import host_value


def images_per_s(steps: int, batch_size: int, members: int, seconds: float) -> float | None:
    """Training throughput in member-images per second: ``steps * batch_size * members /
    seconds``; None when no time was measured (no step ran)."""
    return steps * batch_size * members / seconds if seconds else None


def where_trained(
    group: int | None, members: range, mesh: dict, strategy: str, timing: dict, worker: str | None = None
) -> dict:
    """One row of a run's topology: which process on which host trained which members.

    Args:
      worker: the address of the Dask worker running this process, as the task layer
        tells it (the core does not import Dask); None outside a Dask worker.

    Returns:
      ``{"group", "members": [first, last], "host", "pid", "worker", "backend",
      "devices", "processes", "cpu_cores", "mesh", "strategy", "train_seconds",
      "train_member_images_per_s"}``; ``cpu_cores`` the CPU cores the process may run on.
    """
    return {
        "group": group or 0,
        "members": [members.start, members.stop - 1],
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "worker": worker,
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "cpu_cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "mesh": mesh,
        "strategy": strategy,
        "train_seconds": timing["train_seconds"],
        "train_member_images_per_s": timing.get("train_member_images_per_s"),
    }


def member_records(state, hyperparameters: list[dict], first: int = 0) -> list[dict]:
    """Per member: ``member`` (index, counted from ``first``), ``hyperparameters``, ``best_epoch`` (1-based, by
    validation NLL; None without a validation split), ``best_validation_nll`` (nats),
    ``stopped_epoch`` (early stopping; None when it trained to the end) and ``healthy``."""
    healthy = host_value(state.healthy)
    best = state.best
    if best is not None:
        best_epoch, stopped_epoch, best_nll = (host_value(x) for x in (best.epoch, best.stopped_epoch, best.nll))
    rows = []
    for i, hp in enumerate(hyperparameters):
        row = {"member": first + i, "hyperparameters": hp, "healthy": bool(healthy[i])}
        if best is None:
            row.update(best_epoch=None, best_validation_nll=None, stopped_epoch=None)
        else:
            epoch, stopped = int(best_epoch[i]), int(stopped_epoch[i])
            row.update(
                best_epoch=epoch or None,
                best_validation_nll=float(best_nll[i]) if epoch else None,
                stopped_epoch=stopped or None,
            )
        rows.append(row)
    return rows
