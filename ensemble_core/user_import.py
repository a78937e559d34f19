"""Importing a user's module (``model.name``, ``data.builder``) so that it cannot end the run.

A module may run anything at import: ``sys.exit(0)`` (a script's ``if __name__`` guard
forgotten), raise ``KeyboardInterrupt``, print. Python's ``except Exception`` lets
``SystemExit`` and ``KeyboardInterrupt`` through, and a CLI that lets ``SystemExit(0)``
through exits 0 with nothing trained and no error (issue 43, class 3). Here both become a
:class:`UserModuleError` the caller reports in one line naming the module, and what the
module prints goes to this module's logger, one line, instead of the command's output
(whose last line is the run directory).

What the user's code prints (at import, or while a network is built and traced) is
captured by :func:`captured_output` into a bounded buffer (the first and last
:data:`KEPT_LINES` lines and a count) and logged once when the code returns. Under a flow
with ``log_prints=True`` Prefect's patched ``print`` would otherwise turn every call into
an API log record: a network that printed 200,000 lines took minutes to build and the run
did not obey SIGTERM until the records drained (issue "reliability round five", class 4).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import logging
import signal
import sys
import threading
from collections import deque
from collections.abc import Iterator
from types import ModuleType

__all__ = [
    "CALL_EXIT_FIX",
    "EXIT_FIX",
    "KEPT_LINES",
    "BoundedOutput",
    "UserModuleError",
    "captured_output",
    "import_user_module",
    "user_code",
]

#: Lines of a user's output kept from its start and from its end; the rest are counted.
KEPT_LINES = 5
_LINE_CHARS = 200  # a kept line is cut to this many characters

#: The fix of a :class:`UserModuleError`, for the caller's one-line error.
EXIT_FIX = (
    "move the module's exit (or its script code) under if __name__ == '__main__': so that importing it only "
    "defines things"
)

#: The fix when the user's code ends the process when called (not at import).
CALL_EXIT_FIX = "raise an exception instead of calling sys.exit (or raising KeyboardInterrupt) in the network's code"

log = logging.getLogger(__name__)


class UserModuleError(RuntimeError):
    """A user's module tried to end the process while it was imported
    (``SystemExit`` or ``KeyboardInterrupt``); the message says which and with what code."""


def import_user_module(name: str) -> ModuleType:
    """``importlib.import_module(name)``, with the module's own attempts to end the process
    turned into an error, and its output to stdout and stderr logged (one line).

    Raises:
      UserModuleError: the module raised ``SystemExit`` (any code, ``sys.exit()`` included)
        or ``KeyboardInterrupt`` at import.
      ImportError, Exception: whatever else the import raises, unchanged.
    """
    try:
        with captured_output(f"module '{name}' printed at import"):
            return importlib.import_module(name)
    except SystemExit as exc:
        raise UserModuleError(f"module '{name}' called sys.exit({exc.code!r}) while it was imported") from None
    except KeyboardInterrupt:
        raise UserModuleError(f"module '{name}' raised KeyboardInterrupt while it was imported") from None


class BoundedOutput:
    """A write-only text stream that keeps the first and last ``kept`` non-blank lines
    written to it (each cut to 200 characters) and counts them all: memory and time per
    line stay constant however much is written."""

    def __init__(self, kept: int = KEPT_LINES):
        self.kept = kept
        self.first: list[str] = []
        self.last: deque[str] = deque(maxlen=kept)
        self.lines = 0
        self._partial = ""
        self.closed = False

    def write(self, text: str) -> int:
        text = str(text)
        parts = (self._partial + text).split("\n")
        self._partial = parts.pop()[-4 * _LINE_CHARS :]
        for line in parts:
            self._add(line)
        return len(text)

    def _add(self, line: str) -> None:
        if not line.strip():
            return
        self.lines += 1
        line = line.rstrip()[:_LINE_CHARS]
        if len(self.first) < self.kept:
            self.first.append(line)
        else:
            self.last.append(line)

    def flush(self) -> None:
        pass

    def close(self) -> None:  # a user's code that closes sys.stdout closes nothing real
        self.closed = True

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def summary(self) -> str:
        """The kept lines joined by `` | ``, with how many lines between them were left out."""
        if self._partial.strip():
            self._add(self._partial)
            self._partial = ""
        shown = len(self.first) + len(self.last)
        if self.lines <= shown:
            return " | ".join([*self.first, *self.last])
        return " | ".join([*self.first, f"... {self.lines - shown} more lines ...", *self.last])


def _plain_print(*args, sep=" ", end="\n", file=None, flush=False) -> None:
    """``print`` that writes to its file (``sys.stdout`` by default), whatever a flow's
    ``log_prints`` has made of ``builtins.print``."""
    target = sys.stdout if file is None else file
    if target is None:
        return
    target.write((" " if sep is None else sep).join(map(str, args)) + ("\n" if end is None else end))
    if flush:
        target.flush()


_print_lock = threading.Lock()
_print_state: dict = {"depth": 0, "saved": None}


def _plain_print_on() -> None:
    with _print_lock:
        if _print_state["depth"] == 0:
            _print_state["saved"] = builtins.print
            builtins.print = _plain_print
        _print_state["depth"] += 1


def _plain_print_off() -> None:
    with _print_lock:
        _print_state["depth"] -= 1
        if _print_state["depth"] == 0:
            builtins.print, _print_state["saved"] = _print_state["saved"], None


@contextlib.contextmanager
def captured_output(heading: str) -> Iterator[BoundedOutput]:
    """Run the body (a user's code) with its stdout and stderr, ``print`` included, going
    to a :class:`BoundedOutput`, and log what it printed once afterwards: ``"<heading>:
    first | ... | ... N more lines ... | last"``. ``builtins.print`` is plain meanwhile, so a
    flow's ``log_prints`` does not turn each call into a Prefect log record."""
    buffer = BoundedOutput()
    _plain_print_on()
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        _plain_print_off()
        if buffer.lines or buffer._partial.strip():
            log.info("%s: %s", heading, buffer.summary())


@contextlib.contextmanager
def user_code(what: str) -> Iterator[None]:
    """Run the body (a call into a user's code: a network's constructor, its forward pass
    traced) so that the code cannot end the process: ``SystemExit`` (any code) and a
    ``KeyboardInterrupt`` it raises itself become a :class:`UserModuleError` naming
    ``what``. What it prints is captured (:func:`captured_output`) and logged once,
    bounded. A real SIGINT meanwhile (Ctrl-C: its handler runs, in the main thread) still
    propagates as the stop it is.

    Raises:
      UserModuleError: the body raised ``SystemExit`` or, without a SIGINT, ``KeyboardInterrupt``.
    """
    with captured_output(f"{what} printed"), _exits_refused(what):
        yield


@contextlib.contextmanager
def _exits_refused(what: str) -> Iterator[None]:
    signalled: list[int] = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):

            def noted(signum, frame, handler=handler):
                signalled.append(signum)
                return handler(signum, frame)

            previous = signal.signal(signal.SIGINT, noted)
    try:
        yield
    except SystemExit as exc:
        raise UserModuleError(f"{what} called sys.exit({exc.code!r})") from None
    except KeyboardInterrupt:
        if signalled:
            raise
        raise UserModuleError(f"{what} raised KeyboardInterrupt") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
