"""How the command lines report a refused, failed or stopped run."""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
from collections.abc import Iterator

from ensemble_core.errors import EnsembleError, PreemptedError

EXIT_BAD_INPUT = 2  # bad input or a failed stage: one line on stderr
EXIT_PREEMPTED = 75  # stopped by SIGTERM/SIGINT (after a checkpoint when training); rerun to resume (EX_TEMPFAIL)


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
