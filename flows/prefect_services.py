"""Prefect's background services of a flow-run process: watched during the run, drained
(boundedly) at its end.

Prefect's events and log workers are background threads of the flow-run process. If one
dies (as the events worker did when TFDS swapped the import machinery under it), the
run's events, task runs or logs never reach the server and the process used to hang at
exit in the services' unbounded drain. :class:`PrefectServices` notices the death, so the
run ends ``Crashed`` (and is re-run) instead of ``Completed`` with records missing, and
:func:`drain_services` bounds the drain at exit (also used by :mod:`flows.ephemeral`
before it stops its temporary server).

A command line's preflight logs before its flow run exists: :func:`logs_held_for_next_run`
holds the project's records from Prefect's API log handler and :func:`send_held_logs`
sends them to the flow run once it has started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator

from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogHandler, APILogWorker
from prefect.states import Crashed, State

from flows import environment

DRAIN_TIMEOUT_S = 30.0  # at exit: longest wait for the last events and logs to be sent


class PrefectServices:
    """Watches Prefect's events and API-log workers of this process during a flow run.

    Create it at the start of the flow (it starts both services, as the first event or log
    would) and call :meth:`outcome` at the end.
    """

    def __init__(self) -> None:
        self._services = {"events": EventsWorker.instance(), "logs": APILogWorker.instance()}
        _register_bounded_drain()
        environment.attach_project_logger()  # the project's records go to this flow run's logs

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
            _, not_done = service.drain_all(timeout=timeout)  # type: ignore[misc]  # sync: no event loop here
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

    threading._register_atexit(drain)  # type: ignore[attr-defined]  # what Prefect's services use


# MARK: the command line's preflight logs, sent to the flow run it starts

PROJECT_LOGGER = environment.PROJECT_LOGGER  # attached to Prefect's API log handler (flows.environment)
_HELD: list[logging.LogRecord] = []


class _HoldOutsideRuns(logging.Filter):
    """On Prefect's API log handler: a record of the project's loggers emitted while no
    flow or task run is current is held (:data:`_HELD`) instead of sent; any other record
    passes as before."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != PROJECT_LOGGER and not record.name.startswith(PROJECT_LOGGER + "."):
            return True
        if getattr(record, "flow_run_id", None) or _run_context() is not None:
            return True
        _HELD.append(record)
        return False


def _run_context():
    """The current flow or task run's context, or None outside both."""
    from prefect.context import FlowRunContext, TaskRunContext

    return TaskRunContext.get() or FlowRunContext.get()


def _api_handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger(PROJECT_LOGGER).handlers if isinstance(h, APILogHandler)]


@contextlib.contextmanager
def logs_held_for_next_run() -> Iterator[None]:
    """Hold the project's log records emitted inside this block outside any flow run, for
    the flow run this process starts next (:func:`send_held_logs`).

    A command line prepares the dataset in its preflight, before it starts the flow run
    (so that bad input is one line and exit code 2, with no flow run): the preparation's
    records (decoding progress, files skipped, a snapshot set aside) were then emitted
    outside any run context. Prefect's ``APILogHandler`` cannot send such a record; it
    warned once per logging call site (``UserWarning: Logger 'ensemble_core...'
    attempted to send logs to the API without a flow run id``, the setting
    ``PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW``, PrefectHQ/prefect#7851 and #8311) and the
    records never reached the flow run's logs. Here the API handler holds them instead;
    the console shows them when they happen, as before.
    """
    _HELD.clear()
    hold = _HoldOutsideRuns()
    handlers = _api_handlers()
    for handler in handlers:
        handler.addFilter(hold)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(hold)


def send_held_logs() -> int:
    """Send the records :func:`logs_held_for_next_run` held to the current flow run's logs
    (inside the flow run: Prefect's API handler takes the run's id from its context); each
    keeps the time it was logged at. Returns how many; none are held afterwards."""
    records, _HELD[:] = list(_HELD), []
    if _run_context() is None:
        return 0
    handlers = _api_handlers()
    for record in records:
        for handler in handlers:
            handler.handle(record)
    return len(records) if handlers else 0


def discard_held_logs() -> None:
    """Forget the held records (the command line's flow run never started)."""
    _HELD.clear()
