"""Calls to the Prefect API that training must never wait for."""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any


class BackgroundSender:
    """Progress updates sent from a daemon thread, so that training never waits for the
    Prefect API: an update is a blocking call, which a slow or unreachable server holds
    for as long as the client's timeouts and retries last, and meanwhile the training
    loop could not stop (and let go of its lock, e.g. on a worker cut off from the
    cluster). While one update is in flight the next is skipped (:meth:`idle`); a failed
    one is logged and training goes on."""

    def __init__(self, logger) -> None:
        self._logger = logger
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress-updates", daemon=True)
        self._thread.start()

    def idle(self) -> bool:
        return not self._busy.is_set()

    def send(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call ``fn(*args, **kwargs)`` in the sender's thread, in the caller's context
        (the Prefect run's, for its client settings)."""
        self._busy.set()
        self._queue.put((contextvars.copy_context(), fn, args, kwargs))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            context, fn, args, kwargs = item
            try:
                context.run(fn, *args, **kwargs)
            except Exception as err:  # noqa: BLE001  (progress is best effort; training goes on)
                self._logger.warning("a progress update failed: %s", err)
            finally:
                self._busy.clear()

    def close(self, timeout_s: float = 30.0) -> None:
        """Let the update in flight finish (at most ``timeout_s``: a later one must not be
        overtaken by it), then end the thread."""
        self._queue.put(None)
        self._thread.join(timeout_s)
