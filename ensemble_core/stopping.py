"""One stop request per process: a stop signal records it, every stage honours it at its
next boundary.

A Python signal handler that *raises* (``KeyboardInterrupt``, Prefect's
``TerminationSignal``) raises wherever the main thread happens to be, and when that is a
garbage-collection callback (``weakref`` finalisers, ``__del__``) Python prints
"Exception ignored" and discards the exception: the stop is lost and the run finishes as
if nothing had happened. So while :func:`stop_signals` is active, SIGTERM and SIGINT only
*record* the request (a flag that cannot be lost) and the code polls it where stopping is
safe:

- training, after every step (a checkpoint is written there first,
  :mod:`ensemble_core.runs.training.trainer`), in whichever thread trains (a member group on a
  thread-pool task runner never sees a signal itself);
- evaluation and prediction, before every batch (:func:`ensemble_core.predict.member_probs`)
  and between evaluators, inside a :func:`stage`;
- every stage of :func:`ensemble_core.runs.run`, when it starts and when it ends;
- member groups in other processes (Dask workers), through a file in the run directory
  (:func:`relay_to_file`, :func:`file_requested`).

:func:`check` then raises :class:`~ensemble_core.errors.PreemptedError` naming the signal,
the stage and the fix, which the command lines turn into one line and exit code 75.
"""

from __future__ import annotations

import contextlib
import contextvars
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from ensemble_core.errors import PreemptedError

__all__ = [
    "check",
    "clear",
    "file_requested",
    "outside_stage",
    "relay_to_file",
    "request",
    "requested",
    "stage",
    "stop_signals",
]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_requested: signal.Signals | None = None
_lock = threading.Lock()
_depth = 0  # active stop_signals() scopes (main thread)
# (what is running, the fix) of the innermost active stage(); None outside every stage.
_stage: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("ensemble_stage", default=None)


def request(signum: int = signal.SIGTERM) -> None:
    """Record a stop request (what the signal handler does; also callable from code, e.g.
    a test or a supervisor thread). The first request's signal is kept."""
    global _requested
    with _lock:
        if _requested is None:
            _requested = signal.Signals(signum)


def requested() -> signal.Signals | None:
    """The signal of the pending stop request, or None."""
    return _requested


def clear() -> None:
    """Forget a stop request (when the run it stopped has ended)."""
    global _requested
    with _lock:
        _requested = None


def _record(signum: int, _frame) -> None:
    if signum == signal.SIGINT and _requested is not None:
        raise KeyboardInterrupt  # Ctrl-C twice: the user wants out now, boundary or not
    request(signum)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """While active, SIGTERM and SIGINT record a stop request instead of raising or killing
    (main thread only: elsewhere nothing is installed, the caller's handlers apply). The
    previous handlers come back on exit. Nested uses (a Prefect subflow reinstalls
    Prefect's raising handler for its duration, so it needs its own) are harmless; a
    request is forgotten only when the outermost use exits, so a later run in the same
    process (a test, a notebook) starts clean."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)
    _depth += 1
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _depth -= 1
        if _depth == 0:
            clear()


@contextlib.contextmanager
def stage(what: str, fix: str) -> Iterator[None]:
    """Mark the code inside as stage ``what`` (e.g. "evaluation"), stoppable at its
    boundaries: :func:`check` on entry, at every :func:`check` inside (batches, evaluators)
    and on a normal exit.

    Raises:
      PreemptedError: a stop was requested: "stopped by SIGTERM during <what>; fix: <fix>".
    """
    token = _stage.set((what, fix))
    try:
        check()
        yield
        check()
    finally:
        _stage.reset(token)


def check() -> None:
    """Raise if a stop was requested and the caller runs inside a :func:`stage` (outside
    one, e.g. inside training, whose loop stops at its own step boundary after a
    checkpoint, this does nothing).

    Raises:
      PreemptedError: "stopped by <signal> during <stage>; fix: <the stage's fix>".
    """
    sig, current = _requested, _stage.get()
    if sig is not None and current is not None:
        what, fix = current
        raise PreemptedError(f"stopped by {sig.name} during {what}", fix=fix)


@contextlib.contextmanager
def outside_stage() -> Iterator[None]:
    """Suspend the enclosing :func:`stage` (training's validation passes run
    :func:`ensemble_core.predict.member_probs`, whose checks must not stop training
    before its checkpoint)."""
    token = _stage.set(None)
    try:
        yield
    finally:
        _stage.reset(token)


@contextlib.contextmanager
def relay_to_file(path: Path, poll_s: float = 0.2) -> Iterator[None]:
    """While active, a stop request of this process is relayed to ``path`` (written within
    ``poll_s`` seconds, holding the signal's name) for code in *other processes* to see
    with :func:`file_requested`: member groups on Dask workers, which never receive the
    signal the run's process got, share the run directory. A stale file from an earlier
    stop is removed on entry and the file on exit (by then the groups have ended).

    Raises:
      OSError: the stale file cannot be removed (the run directory is not writable).
    """
    path.unlink(missing_ok=True)
    done = threading.Event()

    def relay() -> None:
        while not done.wait(poll_s):
            sig = _requested
            if sig is not None:
                with contextlib.suppress(OSError):  # the run's own stop is still honoured
                    path.write_text(sig.name)
                return

    watcher = threading.Thread(target=relay, name="stop-relay", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
        path.unlink(missing_ok=True)


def file_requested(path: Path) -> Callable[[], bool]:
    """A ``should_stop`` for training in another process: True once :func:`relay_to_file`
    wrote ``path`` (one ``stat`` per call: microseconds, cheap enough for every step)."""
    return path.exists
