"""One program across JAX processes: the multi-host generalisation of the Flax ensembling guide's ``pmap``.

With ``distributed.num_processes = N > 1`` the training stage runs the same
:func:`ensemble_core.runs.training.trainer.train` in N JAX processes joined by
``jax.distributed.initialize`` (CPU collectives: gloo). The ``('ensemble', 'data')``
mesh spans every process's devices (process p holds devices ``p*D .. p*D+D-1`` of the
global list), so the ``shard_map`` step is one SPMD program: members split over the
``ensemble`` axis, each batch over the ``data`` axis, which crosses processes when it is
longer than one process's devices (gradients are then all-reduced across them). orbax
writes one checkpoint from all processes; values the host needs (losses, validation
NLLs, flags) are gathered with ``process_allgather`` (:func:`ensemble_core.mesh.host_value`).

**On one machine** (:func:`~ensemble_core.runs.training.launcher.train_processes`, what the
flow does): the launcher holds the run directory's lock, starts N child processes on loopback (``python -m
ensemble_core.runs.training.processes``, each with ``8 // N`` simulated CPU devices, so the
global mesh has the 8 devices of one process), forwards process 0's epoch records, and
reads its summary back. If a process dies, the others stop within
:data:`HEARTBEAT_TIMEOUT_S` (JAX's coordination service sees the missing heartbeats and
terminates them; the launcher kills whatever is left after :data:`EXIT_GRACE_S` more)
and the stage fails with :class:`~ensemble_core.errors.PreemptedError`: rerunning the run
name resumes from the latest checkpoint.

**On a cluster** each process is started by the cluster's launcher (a SLURM ``srun``
step, a Kubernetes indexed job, ...) as ``python -m ensemble_core.runs.training.processes RUN_DIR
--config CFG.yaml [--set KEY=VALUE ...]``, with no ``--coordinator``/``--process-id``:
``jax.distributed.initialize()`` detects the coordinator, the process count and its
index from the environment (see JAX's "Running on multiple hosts" guide). The run
directory must be on storage every process reaches; the flow, run afterwards with the
same run name, finds the finished checkpoint and evaluates it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from ensemble_core import startup_gc
from ensemble_core.config import PipelineConfig, load_config
from ensemble_core.data import DatasetInfo
from ensemble_core.errors import EnsembleError
from ensemble_core.processutil import die_with_parent
from ensemble_core.runs.dataset import prepare
from ensemble_core.runs.training.launcher import (
    HEARTBEAT_TIMEOUT_S,
    INIT_TIMEOUT_S,
)
from ensemble_core.runs.training.trainer import train

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """One JAX process of the program: join the others, train, print process 0's summary."""
    startup_gc.resume()  # paused by ensemble_core/__init__.py while this module imported
    parser = argparse.ArgumentParser(
        prog="python -m ensemble_core.runs.training.processes", description=__doc__.split("\n")[0]
    )
    parser.add_argument("run_dir")
    parser.add_argument("--spec", help="JSON file: config, dataset (written by train_processes)")
    parser.add_argument("--config", help="without --spec: the run's YAML config (default: the built-in defaults)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--coordinator", default=None, help="host:port of process 0 (default: detected)")
    parser.add_argument("--num-processes", type=int, default=None)
    parser.add_argument("--process-id", type=int, default=None)
    args = parser.parse_args(argv)

    if args.spec:  # started by train_processes: killed with the launcher (which holds the
        # run's lock), so no process trains on unseen; elsewhere the heartbeat timeout applies
        die_with_parent(signal.SIGKILL)
    if args.spec and not Path(args.spec).is_file():
        return _refuse(f"--spec {args.spec} is not a file; fix: give the spec file train_processes wrote, or --config")
    import jax

    try:
        jax.distributed.initialize(
            args.coordinator,
            args.num_processes,
            args.process_id,
            initialization_timeout=INIT_TIMEOUT_S,
            heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
        )
    except (ValueError, RuntimeError) as err:  # no coordinator found, or the others never joined
        return _refuse(
            f"joining the other JAX processes failed ({str(err).splitlines()[0][:200]}); fix: start every process "
            f"with the same --coordinator HOST:PORT and --num-processes N and its own --process-id, or under a "
            f"cluster launcher JAX detects (SLURM, Kubernetes, ...)"
        )
    first = jax.process_index() == 0

    def on_epoch(record: dict) -> None:
        if first:
            print(json.dumps({"epoch_record": record}), flush=True)

    try:
        if args.spec:
            spec = json.loads(Path(args.spec).read_text())
            cfg = PipelineConfig.model_validate(spec["config"])
            dataset = DatasetInfo.model_validate(spec["dataset"])
        else:  # started by a cluster's launcher: every process reads the same config
            cfg = load_config(args.config, args.overrides)
            dataset = prepare(cfg.data)
        summary = train(cfg, dataset, args.run_dir, on_epoch=on_epoch, own_run_dir=False)
    except BaseException as err:  # noqa: BLE001  (every failure ends this process the same way)
        _exit_now(err)
    if first:
        print(json.dumps({"summary": summary.to_json()}), flush=True)
    jax.distributed.shutdown()  # every process got here: the shutdown barrier passes at once
    return 0


def _refuse(message: str) -> int:
    """A refusal before this process joined the others: one ``error:`` line, exit 2."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


def _exit_now(err: BaseException) -> NoReturn:
    """End a failed process at once: its one-line ``error:`` (an EnsembleError, exit 2) or
    its traceback (anything else, exit 1) on stderr, then ``os._exit``.

    Not a normal interpreter exit: that destroys JAX's distributed client, whose
    destructor calls the coordination service's shutdown barrier and waits there
    (``shutdown_timeout_seconds``, 300 s) for the other processes, which are blocked in a
    collective waiting for this one. The barrier then timed out, every process aborted
    (SIGABRT, a native stack trace last in its log) and the real error, e.g. a
    ``RuntimeError`` in process 1, was buried under process 0's "Shutdown barrier has
    failed". Exiting without the barrier lets the others see this process die (missed
    heartbeats, ``HEARTBEAT_TIMEOUT_S``; the launcher kills what is left) and the
    launcher quote this process's own error.
    """
    if isinstance(err, EnsembleError):
        print(f"error: {err}", file=sys.stderr, flush=True)
        code = 2
    else:
        traceback.print_exception(err, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
