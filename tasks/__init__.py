"""One thin Prefect task per pipeline stage; the work is in ``ensemble_core.pipeline``."""

from __future__ import annotations

from typing import Any

from ensemble_core.errors import EnsembleError


def is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry a stage unless it failed on purpose.

    An :class:`~ensemble_core.errors.EnsembleError` (bad input, a locked or incompatible
    run, a diverged member, preemption) fails the same way on every attempt, so it is not
    retried; anything else (an I/O error, a lost connection to the server) is.
    """
    try:
        state.result()
    except EnsembleError:
        return False
    except BaseException:  # noqa: BLE001
        return True
    return True


# Keyword arguments of every stage's @task: two retries, 10 s apart, for transient errors.
TRANSIENT_RETRIES: dict[str, Any] = {"retries": 2, "retry_delay_seconds": 10, "retry_condition_fn": is_transient}
