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

Prefect's events and log workers are background threads of the flow-run process. If one
dies (as the events worker did when TFDS swapped the import machinery under it), the
run's events, task runs or logs never reach the server and the process used to hang at
exit in the services' unbounded drain. :class:`PrefectServices` notices the death, so the
run ends ``Crashed`` (and is re-run) instead of ``Completed`` with records missing, and
bounds the drain at exit.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from prefect import get_run_logger
from prefect.events.worker import EventsWorker
from prefect.exceptions import FailedRun
from prefect.logging.handlers import APILogHandler, APILogWorker
from prefect.runtime import flow_run
from prefect.states import Cancelled, Crashed, Failed, State

from ensemble_core.errors import EnsembleError, PreemptedError
from flows._cli import EXIT_BAD_INPUT, EXIT_PREEMPTED, in_flags

PREEMPTED_PREFIX = "preempted: "
DRAIN_TIMEOUT_S = 30.0  # at exit: longest wait for the last events and logs to be sent


class _RefusalTraceback(logging.Filter):
    """Drops the traceback Prefect's engine logs after a run that ended with our refusal.

    A deployment's flow-run process re-raises a Failed final state as ``FailedRun`` and
    logs it as "Engine execution exited with unexpected exception" with a traceback, which
    ``--watch`` then prints below the one-line ``error: ...; fix: ...`` it repeats. Only
    that record is dropped; any other failure keeps its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, FailedRun) and str(exc).startswith("error: ") and "; fix: " in str(exc))


logging.getLogger("prefect.flow_runs").addFilter(_RefusalTraceback())


def _flush_logs() -> None:
    try:
        APILogHandler.flush()  # bounded (5 s) by Prefect
    except Exception:  # noqa: BLE001  (no API log handler, e.g. logging to the API is off)
        pass


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


def finish_cli(state: State) -> int:
    """End a CLI on its flow run's final state: the result (the path written) as the last
    stdout line and 0, or the :func:`exit_code` line on stderr and its code."""
    code, line = exit_code(state)
    if line:
        print(in_flags(line), file=sys.stderr)
        return code
    print(state.result(), flush=True)
    return 0


def run_cli(flow_fn, **parameters) -> int:
    """Run ``flow_fn(**parameters)`` for a command line and return :func:`finish_cli`'s
    exit code. The flow runs against the configured Prefect server, or a temporary one
    that dies with this process even on SIGKILL (:mod:`flows._ephemeral`)."""
    from flows import _ephemeral

    try:
        with _ephemeral.temporary_server():
            return finish_cli(flow_fn(**parameters, return_state=True))
    except _ephemeral.ServerStartError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


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
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            state = client.read_flow_run(run_id).state
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


class PrefectServices:
    """Watches Prefect's events and API-log workers of this process during a flow run.

    Create it at the start of the flow (it starts both services, as the first event or log
    would) and call :meth:`outcome` at the end.
    """

    def __init__(self) -> None:
        self._services = {"events": EventsWorker.instance(), "logs": APILogWorker.instance()}
        _register_bounded_drain()

    def dead(self) -> list[str]:
        """Names of the watched services whose thread has stopped."""
        return [name for name, svc in self._services.items() if getattr(svc, "_stopped", False)]

    def outcome(self, result: str) -> str | State:
        """``result`` if every service is alive; else a ``Crashed`` state naming them.

        A dead events worker means some of this run's events and task-run records were
        lost; a re-run (the ``retry-crashed-runs`` automation) resumes from the latest
        checkpoint and publishes them again.
        """
        dead = self.dead()
        if not dead:
            return result
        message = (
            f"Prefect's {' and '.join(dead)} worker stopped during this flow run, so some of its "
            f"records did not reach the server; the work itself is saved and a re-run resumes it"
        )
        print(f"error: {message}", file=sys.stderr, flush=True)
        return Crashed(message=message)


_DRAIN_REGISTERED = threading.Event()


def drain_services(timeout: float) -> int:
    """Wait at most ``timeout`` s for Prefect's API-log and events workers to send what
    they hold (this stops them); returns how many items were still not sent."""
    pending = 0
    for service in (APILogWorker, EventsWorker):
        try:
            _, not_done = service.drain_all(timeout=timeout)
            pending += len(not_done)
        except Exception:  # noqa: BLE001  (none started, or already stopped)
            pass
    return pending


def _register_bounded_drain() -> None:
    """At interpreter exit, drain Prefect's services for at most ``DRAIN_TIMEOUT_S``.

    Prefect's own at-exit drain waits without a timeout; a service that cannot send (the
    server gone, a dead thread) kept the flow-run process alive forever. Still so in
    Prefect 3.9.1: ``QueueService._at_exit`` calls ``drain(at_exit=True)``, which waits on
    the service's future with no timeout. Upstream bounded only ``drain_all``'s explicit
    ``timeout`` and ``APILogHandler.flush`` (PrefectHQ/prefect#9345, #9354, #9399); 3.9's
    fix for forked children (a service never started in the child) does not cover a
    started service that cannot send. Registered after
    the services started, this runs before their drains (threading runs its exit callbacks
    in reverse order) and ends the process if they do not finish in time.
    """
    if _DRAIN_REGISTERED.is_set():
        return
    _DRAIN_REGISTERED.set()

    def drain() -> None:
        if drain_services(DRAIN_TIMEOUT_S):
            print(
                f"error: Prefect's services did not finish sending within {DRAIN_TIMEOUT_S:.0f} s at exit; "
                f"exiting without them (the run's final state was already reported)",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)

    threading._register_atexit(drain)  # type: ignore[attr-defined]  (what Prefect's services use)
