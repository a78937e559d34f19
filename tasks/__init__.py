"""One thin Prefect task per stage of :func:`ensemble_core.runs.run`; the work is in
:mod:`ensemble_core.runs`.

A task has one name, in the Prefect UI and in Python (``prepare_dataset``,
``train_members``, ``select_members``, ``evaluate_members``, ``compare_with_champion``, ``publish_report``;
``resolve_run``, ``load_images``, ``predict_images`` for prediction): what it does to the
run, never the name of the flow (``train-ensemble``, ``predict``) it is part of.
"""

from __future__ import annotations

import errno
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
