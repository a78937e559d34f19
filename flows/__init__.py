"""Prefect flows: the pipeline DAG and its CLI entry point."""

import os
import signal
import sys

if sys.argv[:1] == ["-m"]:  # `python -m flows.<command>`: runpy imports this package first
    # A stop signal while the command starts ends it at once in one line (nothing is written
    # yet): installed before the imports below take their half second. The command replaces
    # these handlers with its own once its modules are imported (flows._cli).
    def _stopped_while_starting(signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        os.write(2, f"error: stopped by {name} while starting; fix: run the command again\n".encode())
        os._exit(75)

    for _sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_sig, _stopped_while_starting)

from flows import _env  # noqa: F401  (sets XLA_FLAGS before anything imports JAX)
