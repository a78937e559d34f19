"""Prefect flows: the pipeline DAG and its CLI entry point."""

import os
import signal
import sys

if (
    sys.argv[:1] == ["-m"]
    or os.environ.get("ENSEMBLE_EPHEMERAL_PARENT_PID")
    # a deployment's flow-run process: `python -m prefect.engine`, as Prefect's process worker
    # and runner start one per flow run, loading a flow of this package from its entrypoint
    or getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) == "prefect.engine"
):
    # `python -m flows.<command>` (runpy imports this package first), the temporary Prefect
    # server a command started (flows.ephemeral, whose app factory uvicorn imports), or a
    # deployment's flow-run process loading its flow: the garbage collector is off while the
    # process imports its modules (a quarter of a command's import time; JAX, Flax, orbax
    # and TFDS, about 1.5 of a flow-run process's 4 CPU s); command_line.command_started
    # (main()'s first statement), the server's app factory once its app is built, or the
    # flow's first statement (flows.train_ensemble, flows.predict, flows.monitor) resumes it.
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
