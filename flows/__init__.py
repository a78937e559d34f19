"""Prefect flows: the pipeline DAG and its CLI entry point."""

import os
import signal
import sys

if sys.argv[:1] == ["-m"] or os.environ.get("ENSEMBLE_EPHEMERAL_PARENT_PID"):
    # `python -m flows.<command>` (runpy imports this package first), or the temporary
    # Prefect server a command started (flows.ephemeral, whose app factory uvicorn imports):
    # the garbage collector is off while the process imports its modules (a quarter of
    # their import time); command_line.command_started (main()'s first statement), or the
    # server's app factory once its app is built, resumes it.
    from ensemble_core import startup_gc

    startup_gc.pause()

if sys.argv[:1] == ["-m"]:
    # A stop signal while the command starts ends it at once in one line (nothing is written
    # yet): installed before the imports below take their half second. The command replaces
    # these handlers with its own once its modules are imported (flows.command_line).
    def _stopped_while_starting(signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        os.write(2, f"error: stopped by {name} while starting; fix: run the command again\n".encode())
        os._exit(75)

    for _sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_sig, _stopped_while_starting)

    def _end_without_teardown() -> None:
        """The last exit hook (registered first): once the command has ended through
        ``flows.command_line.end`` and every other hook has run, exit without the interpreter's
        teardown of the modules (seconds after a run, nothing written)."""
        cli = sys.modules.get("flows.command_line")
        code = cli.ending_code() if cli is not None else None
        if code is None:  # an uncaught exception or another way out: the usual teardown
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        os._exit(code)

    import atexit
    import contextlib

    atexit.register(_end_without_teardown)

    # The temporary Prefect server starts now, while the command imports and checks its input.
    from flows import ephemeral

    ephemeral.start_early(sys.orig_argv)

from flows import environment  # noqa: F401  (sets XLA_FLAGS before anything imports JAX)
