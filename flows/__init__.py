"""Prefect flows: the pipeline DAG and its CLI entry point."""

import os
import signal
import sys
import types

# The modules a deployment's entrypoint names (prefect.yaml): each flow's first statement
# turns the collector back on (startup_gc.resume).
_FLOW_MODULES = ("train_ensemble.py", "predict.py", "monitor.py")


def _loaded_as_a_flow_run_entrypoint() -> bool:
    """Whether this process is a deployment's flow-run process (``python -m prefect.engine``,
    as Prefect's process worker and runner start one per flow run) and the module importing
    this package is one of its flow modules, which Prefect's engine is loading from the
    deployment's entrypoint. A user's own flow module that imports this package (for a
    helper, or to call one of its flows) is not: its process keeps its collector."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(main_spec, "name", None) != "prefect.engine":
        return False
    # 0: this function, 1: this package's module code, then the import machinery's frames,
    # then the module whose import statement imports this package
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    importer = frame.f_globals.get("__file__") if frame is not None else None
    if importer is None:
        return False
    here, name = os.path.split(os.path.realpath(importer))
    return name in _FLOW_MODULES and here == os.path.dirname(os.path.realpath(__file__))


if sys.argv[:1] == ["-m"] or os.environ.get("ENSEMBLE_EPHEMERAL_PARENT_PID") or _loaded_as_a_flow_run_entrypoint():
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

from flows import environment  # noqa: F401, E402  (sets XLA_FLAGS before anything imports JAX)
