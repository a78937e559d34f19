"""Importing a user's module (``model.name``, ``data.builder``) so that it cannot end the run.

A module may run anything at import: ``sys.exit(0)`` (a script's ``if __name__`` guard
forgotten), raise ``KeyboardInterrupt``, print. Python's ``except Exception`` lets
``SystemExit`` and ``KeyboardInterrupt`` through, and a CLI that lets ``SystemExit(0)``
through exits 0 with nothing trained and no error (issue 43, class 3). Here both become a
:class:`UserModuleError` the caller reports in one line naming the module, and what the
module prints goes to this module's logger, one line, instead of the command's output
(whose last line is the run directory).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
from types import ModuleType

__all__ = ["EXIT_FIX", "UserModuleError", "import_user_module"]

#: The fix of a :class:`UserModuleError`, for the caller's one-line error.
EXIT_FIX = (
    "move the module's exit (or its script code) under if __name__ == '__main__': so that importing it only "
    "defines things"
)

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
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return importlib.import_module(name)
    except SystemExit as exc:
        raise UserModuleError(f"module '{name}' called sys.exit({exc.code!r}) while it was imported") from None
    except KeyboardInterrupt:
        raise UserModuleError(f"module '{name}' raised KeyboardInterrupt while it was imported") from None
    finally:
        printed = " | ".join(line for line in (out.getvalue() + err.getvalue()).splitlines() if line.strip())
        if printed:
            log.info("module '%s' printed at import: %s", name, printed[:300])
