"""How a flow run ends: the final Prefect state for each kind of outcome.

- **Bad input** (any :class:`~ensemble_core.errors.EnsembleError` but preemption): the run
  ends ``Failed`` at once, never retried, with the CLI's one-line ``error: ...; fix: ...``
  as its state message, also logged (and flushed) so ``prefect deployment run --watch``
  prints it.
- **Infrastructure** (SIGTERM preemption, a Prefect background service that died inside
  the run): the run ends ``Crashed``. The ``retry-crashed-runs`` automation
  (:mod:`flows.automations`) reschedules crashed deployment runs; the re-run has the same
  flow run name and scheduled start, hence the same run directory, and resumes from the
  latest checkpoint. A preemption that is really a cancellation from the UI ends
  ``Cancelled`` instead.
- Transient errors inside a stage are retried by that stage's task
  (:data:`tasks.TRANSIENT_RETRIES`); the flow itself has no ``retries``.

A flow watches Prefect's background services with
:class:`flows.prefect_services.PrefectServices`: a service that died inside the run ends it
``Crashed``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable

from prefect import get_run_logger
from prefect.exceptions import FailedRun
from prefect.logging.handlers import APILogWorker
from prefect.runtime import flow_run
from prefect.states import Cancelled, Crashed, Failed, State

from ensemble_core.errors import EnsembleError, PreemptedError
from flows import ephemeral
from flows.command_line import EXIT_BAD_INPUT, EXIT_PREEMPTED, command_seconds, in_flags

__all__ = [
    "PREEMPTED_PREFIX",
    "exit_code",
    "finish_cli",
    "interrupted",
    "refused",
    "run_cli",
]

PREEMPTED_PREFIX = "preempted: "


class _OneLineForOwnErrors(logging.Filter):
    """Drops the traceback Prefect's engines log with the project's own errors; the line
    itself stays.

    - A task run or a subflow run that raised an
      :class:`~ensemble_core.errors.EnsembleError` (a refusal naming its fix, a damaged
      file, a preemption: the training stage's member-groups subflow re-raises a group's
      stop) is logged by ``prefect.task_engine`` / ``prefect.flow_engine`` at ERROR with
      ``exc_info``, which printed a traceback before the command's one-line message.
    - A deployment's flow-run process re-raises a Failed final state as ``FailedRun``
      and logs it as "Engine execution exited with unexpected exception" with a
      traceback, which ``--watch`` then prints below the ``error: ...; fix: ...`` line.

    The project owns that boundary here rather than catching its errors inside every
    task, which would mark refused tasks Completed; any other exception keeps its
    traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, FailedRun) and str(exc).startswith("error: ") and "; fix: " in str(exc):
            return False
        if isinstance(exc, EnsembleError):
            what = "stopped" if isinstance(exc, PreemptedError) else "refused"
            kind = "Task run" if record.name.endswith("task_runs") else "Flow run"
            record.msg, record.args = f"{kind} {what}: error: {exc}", ()
            record.exc_info, record.exc_text = None, None
        return True


for _logger in ("prefect.flow_runs", "prefect.task_runs"):
    logging.getLogger(_logger).addFilter(_OneLineForOwnErrors())


def _flush_logs() -> None:
    with contextlib.suppress(Exception):
        # What APILogHandler.flush does outside an event loop (it is an instance method: called
        # on the class it raised TypeError, swallowed below, and flushed nothing).
        APILogWorker.drain_all(timeout=5)


def exit_code(state: State) -> tuple[int, str | None]:
    """The CLI's exit code and stderr line for a flow run's final state.

    0 and no line when it completed; 75 when it was preempted (resumable); else 2 and the
    state message as one ``error: ...`` line (the flow's own refusals already read so).
    """
    if state.is_completed():
        return 0, None
    message = (state.message or state.name or "").strip()
    if message.startswith(PREEMPTED_PREFIX):
        return EXIT_PREEMPTED, f"error: {message[len(PREEMPTED_PREFIX) :]}"
    return EXIT_BAD_INPUT, message if message.startswith("error: ") else f"error: {message}"


def finish_cli(state: State, closing: Callable[[str], list[str]] | None = None) -> int:
    """End a CLI on its flow run's final state: ``closing(result)``'s lines (if given), then
    the result (the path written) as the last stdout line, and 0; or the :func:`exit_code`
    line on stderr and its code."""
    code, line = exit_code(state)
    if line:
        print(in_flags(line), file=sys.stderr)
        return code
    result = state.result()
    if closing is not None:
        for text in closing(str(result)):
            print(text)
    print(result, flush=True)
    return 0


#: ``timed(result, start_seconds, flow_seconds, end_seconds)``: what a command line does with
#: its own timing once the flow has returned and the temporary server has stopped (the
#: training command records it in the run's report).
CommandTimed = Callable[[str, float, float, float], object]


def run_cli(
    flow_fn, closing: Callable[[str], list[str]] | None = None, timed: CommandTimed | None = None, **parameters
) -> int:
    """Run ``flow_fn(**parameters)`` for a command line and return :func:`finish_cli`'s
    exit code (``closing``: its closing lines). The flow runs against the configured Prefect
    server, or a temporary one that dies with this process even on SIGKILL (:mod:`flows.ephemeral`).

    ``timed``, when the flow completed: called with its result and the command's wall seconds
    (:func:`flows.command_line.command_seconds`) from the command's start to the flow's
    call, in the flow, and from the flow's return to the end (the last logs and events sent
    and the temporary server stopped), before the closing lines."""
    try:
        with ephemeral.temporary_server():
            called = command_seconds()
            state = flow_fn(**parameters, return_state=True)
            returned = command_seconds()
    except ephemeral.ServerStartError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if timed is not None and state.is_completed():
        timed(str(state.result()), called, returned - called, command_seconds() - returned)
    return finish_cli(state, closing)


def refused(err: EnsembleError) -> State:
    """Final ``Failed`` state for bad input: ``error: <message>`` (no retry)."""
    line = f"error: {err}"
    get_run_logger().error(line)
    _flush_logs()
    return Failed(message=line)


def _cancelling() -> bool:
    """Whether the server is cancelling this flow run (its SIGTERM was a cancellation)."""
    run_id = flow_run.get_id()
    if not run_id:
        return False
    try:
        from uuid import UUID

        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(run_id)).state
        return state is not None and state.is_cancelling()
    except Exception:  # noqa: BLE001  (server unreachable: treat as a preemption)
        return False


def interrupted(err: PreemptedError) -> State:
    """``Cancelled`` if the user cancelled the run, else ``Crashed`` (to be re-run)."""
    logger = get_run_logger()
    if _cancelling():
        logger.warning("cancelled: %s", err)
        _flush_logs()
        return Cancelled(message=f"cancelled: {err}")
    logger.warning("%s%s", PREEMPTED_PREFIX, err)
    _flush_logs()
    return Crashed(message=f"{PREEMPTED_PREFIX}{err}")
