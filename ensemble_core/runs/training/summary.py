"""The parts of a training summary: its member and topology rows, its throughput, and
the member groups' summaries joined into the run's.

:func:`member_records` (per member: hyperparameters, best epoch, early stop, health) and
:func:`where_trained` (per member group: host, process, devices, speed) are the
``members`` and ``topology`` of :class:`~ensemble_core.runs.results.TrainingSummary`;
:func:`images_per_s` is its throughput figure. A training call builds its summary
(:mod:`ensemble_core.runs.training.trainer`); :func:`join_summaries` derives the run's from its
groups' ones.
"""

from __future__ import annotations

import os
import socket

import jax

from ensemble_core.mesh import host_value
from ensemble_core.runs.results import TrainingSummary, TrainingTiming


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
    validation NLL or by validation error, ``train.member_choice``; None without a validation
    split), ``best_validation_nll`` (nats; ``best_validation_error`` when chosen by accuracy),
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
            key = "best_validation_nll" if best.criterion == "validation_nll" else "best_validation_error"
            row.update(
                {"best_epoch": epoch or None, key: float(best_nll[i]) if epoch else None},
                stopped_epoch=stopped or None,
            )
        rows.append(row)
    return rows


def join_summaries(
    summaries: list[TrainingSummary],
    *,
    checkpoint_dir: str,
    history: list[dict],
    sessions: list[dict],
    members_trained: int,
    diverged_members: list[int],
    images_per_step: int,
) -> TrainingSummary:
    """The run's summary from its member groups' summaries (in group order): group 0's
    mesh, strategy, backend, devices and steps; the longest compile and training times
    (the groups run side by side); the earliest epoch resumed from; every group's member
    and topology rows; the throughput of all groups over the longest training time.

    Args:
      checkpoint_dir, history, sessions, members_trained, diverged_members: the joined
        checkpoint's (``diverged_members`` global member indices).
      images_per_step: member-images of one group's step, ``batch_size * E/G``.
    """
    first = summaries[0]
    seconds = max(s.timing.train_seconds for s in summaries)
    steps = sum(s.timing.steps for s in summaries)
    return first.model_copy(
        update={
            "checkpoint_dir": checkpoint_dir,
            "history": history,
            "timing": TrainingTiming(
                compile_seconds=max(s.timing.compile_seconds for s in summaries),
                train_seconds=seconds,
                steps=first.timing.steps,
                train_member_images_per_s=images_per_s(steps, images_per_step, 1, seconds),
                validation_seconds=max(s.timing.validation_seconds for s in summaries),
                checkpoint_seconds=max(s.timing.checkpoint_seconds for s in summaries),
                setup_seconds=max(s.timing.setup_seconds for s in summaries),
                data_seconds=max(s.timing.data_seconds for s in summaries),
                order_seconds=max(s.timing.order_seconds for s in summaries),
                initialisation_seconds=max(s.timing.initialisation_seconds for s in summaries),
            ),
            "members_trained": members_trained,
            "resumed_from": min((s.resumed_from for s in summaries if s.resumed_from is not None), default=None),
            "sessions": sessions,
            "diverged_members": diverged_members,
            "members": [row for s in summaries for row in s.members],
            "topology": [row for s in summaries for row in s.topology],
        }
    )
