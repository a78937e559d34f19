"""How the command lines report a refused, failed or stopped run."""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import NoReturn

from ensemble_core import startup_gc
from ensemble_core.errors import EnsembleError, PreemptedError
from ensemble_core.timing import process_seconds

EXIT_BAD_INPUT = 2  # bad input or a failed stage: one line on stderr
EXIT_PREEMPTED = 75  # stopped by SIGTERM/SIGINT (after a checkpoint when training); rerun to resume (EX_TEMPFAIL)


_ending_with: int | None = None  # end()'s code, for the exit hook flows/__init__.py installs
_started_at: float | None = None  # time.perf_counter() when main() began (command_started)


def command_started() -> None:
    """Mark the start of a command line's ``main()`` (its first statement): the start of
    the command where ``main`` is called from Python (a test, a notebook) rather than as
    ``python -m flows.<command>``; and the end of its imports, during which
    ``flows/__init__.py`` paused the garbage collector (:func:`ensemble_core.startup_gc.resume`)."""
    global _started_at
    startup_gc.resume()
    _started_at = time.perf_counter()


def command_seconds() -> float:
    """Wall seconds since the command started: since the process started when it is
    ``python -m flows.<command>`` (:func:`ensemble_core.timing.process_seconds`: the
    interpreter and every import counted), else since :func:`command_started`."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if (getattr(spec, "name", None) or "").startswith("flows.") or _started_at is None:
        return process_seconds()
    return time.perf_counter() - _started_at


def end(code: int) -> NoReturn:
    """End a command line with exit code ``code`` (``sys.exit``): every exit hook runs as
    usual (Prefect's services drained, the logs flushed, JAX's backends cleared), then,
    where ``flows/__init__.py`` installed its hook (``python -m flows.<command>``), the
    process ends without the interpreter's teardown of its modules (``os._exit``), which
    took 1.2-1.9 s after a tiny run and writes nothing (docs/benchmarks.md, "The fixed
    cost of a run")."""
    global _ending_with
    _ending_with = code
    sys.exit(code)


def ending_code() -> int | None:
    """The code :func:`end` is ending the process with; None before (or without) it."""
    return _ending_with


# ensemble_core names the parameters a run takes (a deployment's users see those); the
# command lines name their flags.
_FLAGS = {"run_name": "--run-name", "output_dir": "--output-dir", "config_path": "--config"}
_PARAMETER = re.compile(r"\b(" + "|".join(_FLAGS) + r")\b")


def in_flags(message: str) -> str:
    """``message`` with the run parameters its ``fix:`` part names (``run_name``,
    ``output_dir``, ``config_path``) written as the command line's flags; what comes
    before (paths, values the user gave) is left as it is."""
    head, sep, fix = message.rpartition("fix:")
    if not sep:
        return message
    return head + sep + _PARAMETER.sub(lambda m: _FLAGS[m.group(1)], fix)


def report_error(err: EnsembleError) -> int:
    """Print ``error: <message>`` on stderr (parameters named as flags); returns the exit
    code for ``err``."""
    print(f"error: {in_flags(str(err))}", file=sys.stderr)
    return EXIT_PREEMPTED if isinstance(err, PreemptedError) else EXIT_BAD_INPUT


@contextlib.contextmanager
def raise_on_stop_signals() -> Iterator[None]:
    """Replaces the handlers ``flows/__init__.py`` installs while a command starts.

    While active: SIGINT raises KeyboardInterrupt and SIGTERM Prefect's
    ``TerminationSignal`` (what its engine raises), for :func:`stopped` to report;
    training replaces both while it runs, to stop at a step boundary after a checkpoint.
    The previous handlers come back on exit (``main`` may be called in-process)."""
    from prefect.exceptions import TerminationSignal

    def on_term(signum: int, _frame) -> None:
        raise TerminationSignal(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_exceptions() -> tuple[type[BaseException], ...]:
    """The exceptions a stop signal becomes (see :func:`raise_on_stop_signals`)."""
    from prefect.exceptions import TerminationSignal

    return (KeyboardInterrupt, TerminationSignal)


def stopped(err: BaseException, fix: str) -> int:
    """Report a stop signal outside training in one line; returns 75."""
    sig = getattr(err, "signal", signal.SIGINT)
    print(f"error: stopped by {signal.Signals(sig).name}; fix: {fix}", file=sys.stderr, flush=True)
    return EXIT_PREEMPTED
