"""One thin Prefect task per stage of :func:`ensemble_core.runs.run`; the work is in
:mod:`ensemble_core.runs`.

A task has one name, in the Prefect UI and in Python (``prepare_dataset``,
``train_members``, ``select_members``, ``evaluate_members``, ``compare_with_champion``, ``publish_report``;
``resolve_run``, ``load_images``, ``predict_images`` for prediction): what it does to the
run, never the name of the flow (``train-ensemble``, ``predict``) it is part of.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable
from typing import Any

# OSErrors that say something about the input, not about a passing condition: the same
# call fails the same way on every attempt.
_DETERMINISTIC_OS_ERRORS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError)
_DETERMINISTIC_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.ENAMETOOLONG, errno.EINVAL}


def transient(exc: BaseException) -> bool:
    """Whether a stage that raised ``exc`` may succeed if simply run again.

    Only failures of the outside world are: a lost or refused connection, a timeout, an
    interrupted or busy I/O call (``OSError`` but missing files, permissions, a full or
    read-only disk, a name too long), and ``httpx``'s transport errors (the Prefect server
    or a download). Everything else is deterministic and never retried: the project's own
    :class:`~ensemble_core.errors.EnsembleError` (bad input, a locked or incompatible run,
    a diverged member, a preemption), and any other exception (a bug, an XLA error such
    as running out of memory) fails the same way again.
    """
    import httpx

    if isinstance(exc, httpx.TransportError):
        return True
    if isinstance(exc, OSError):
        return not isinstance(exc, _DETERMINISTIC_OS_ERRORS) and exc.errno not in _DETERMINISTIC_ERRNOS
    return False


def is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry a stage only for a :func:`transient` failure."""
    try:
        state.result()
    except BaseException as exc:  # noqa: BLE001
        return transient(exc)
    return False


# Keyword arguments of every stage's @task: two retries, 10 s apart, for transient errors.
TRANSIENT_RETRIES: dict[str, Any] = {"retries": 2, "retry_delay_seconds": 10, "retry_condition_fn": is_transient}


def without_introspection(stage: Callable) -> Callable:
    """``stage`` (a Prefect task) called with each argument wrapped in Prefect's ``quote``
    (``prefect.utilities.annotations``): Prefect then passes the argument as it is instead of
    walking every element of it for upstream futures and states (it visited 53,000 objects
    in a tiny run's nine stages: the config, the dataset's record, the training summary's
    history, the evaluation's metrics; about 0.5 s). The stages are called one after another
    with plain values, so there is no dependency to track. A ``stage`` that is not a task (a
    function calling tasks) is returned as it is."""
    from prefect import Task
    from prefect.utilities.annotations import quote

    if not isinstance(stage, Task):
        return stage

    @functools.wraps(stage)
    def call(*args: Any) -> Any:
        return stage(*(quote(a) for a in args))

    return call
