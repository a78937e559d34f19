"""Importing a user's module (``model.name``, ``data.builder``) so that it cannot end the run.

A module may run anything at import: ``sys.exit(0)`` (a script's ``if __name__`` guard
forgotten), raise ``KeyboardInterrupt``, print. Python's ``except Exception`` lets
``SystemExit`` and ``KeyboardInterrupt`` through, and a CLI that lets ``SystemExit(0)``
through exits 0 with nothing trained and no error (issue 43, class 3). Here both become a
:class:`UserModuleError` the caller reports in one line naming the module, and what the
module prints is captured and logged in one line
(:func:`ensemble_core.output_capture.captured_output`) instead of going to the command's
output (whose last line is the run directory). :func:`user_code` does the same for a call
into a user's code (a network's constructor, its forward pass traced).
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import threading
from collections.abc import Iterator
from types import ModuleType

from ensemble_core.output_capture import captured_output

__all__ = [
    "CALL_EXIT_FIX",
    "EXIT_FIX",
    "UserModuleError",
    "import_user_module",
    "user_code",
]

#: The fix of a :class:`UserModuleError`, for the caller's one-line error.
EXIT_FIX = (
    "move the module's exit (or its script code) under if __name__ == '__main__': so that importing it only "
    "defines things"
)

#: The fix when the user's code ends the process when called (not at import).
CALL_EXIT_FIX = "raise an exception instead of calling sys.exit (or raising KeyboardInterrupt) in the network's code"


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
