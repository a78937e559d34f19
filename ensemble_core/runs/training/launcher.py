"""The launcher of one program across JAX processes on this machine (loopback).

:func:`train_processes` holds the run directory's lock, starts N child processes of
:mod:`ensemble_core.runs.training.processes` (``python -m ensemble_core.runs.training.processes``, each
with ``8 // N`` simulated CPU devices), forwards process 0's epoch records, reads its
summary back, and stops the others when one dies. Kept apart from the child program so
that importing :mod:`ensemble_core.runs` never imports the module ``python -m`` runs.
"""

from __future__ import annotations

import contextvars
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ensemble_core import stopping
from ensemble_core.config import HOST_DEVICES, PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.ensemble_setup import plan
from ensemble_core.errors import EnsembleError, PreemptedError, resume_fix
from ensemble_core.processutil import free_port
from ensemble_core.runs.results import TrainingSummary
from ensemble_core.runs.storage.layout import RunDir, owning_run
from ensemble_core.runs.storage.lock import run_lock

HEARTBEAT_TIMEOUT_S = 10  # a process that misses heartbeats this long is declared dead
EXIT_GRACE_S = 30  # then the launcher waits this long for the others before killing them
INIT_TIMEOUT_S = 120  # every process must have joined within this
_DEVICE_FLAG = "--xla_force_host_platform_device_count"


def local_devices(num_processes: int) -> int:
    """Simulated CPU devices per process when N processes share one machine."""
    return HOST_DEVICES // num_processes


def check_mesh_spans_processes(cfg: PipelineConfig) -> None:
    """With ``distributed.num_processes`` N > 1, refuse (before any process starts) a run
    whose mesh cannot give each of the N processes a device.

    Process p holds devices ``p*D .. p*D+D-1`` (``D = 8 // N``). The mesh's devices are
    spread over the processes (:func:`~ensemble_core.mesh.mesh_devices`) and a mesh of
    fewer devices than processes has its data axis widened
    (:func:`~ensemble_core.mesh.plan_mesh`): e.g. 4 members on 2 processes train 2 on
    each, 1 member trains on ``ensemble 1 x data 2``, one device of each process. A
    process with no device of the mesh failed on its first read of the state.

    Raises:
      MeshError: no mesh gives every process a device (one member, and a batch no
        wider data axis divides).
    """
    if cfg.distributed.num_processes > 1:
        plan(cfg, HOST_DEVICES, processes=cfg.distributed.num_processes)


def _child_env(num_processes: int) -> dict[str, str]:
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_FLAG)]
    env["XLA_FLAGS"] = " ".join([*flags, f"{_DEVICE_FLAG}={local_devices(num_processes)}"])
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def train_processes(
    cfg: PipelineConfig,
    dataset: DatasetInfo,
    run_dir: str | Path,
    *,
    on_epoch: Callable[[dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrainingSummary:
    """Train the ensemble as one program across ``distributed.num_processes`` JAX
    processes on this machine (loopback), holding the run directory's lock meanwhile.

    Args:
      on_epoch: called with process 0's epoch records as they come.
      should_stop: polled every 0.2 s; True (or SIGTERM/SIGINT in the main thread) stops
        every process (SIGKILL: the run resumes from its latest checkpoint, as after a crash).

    Returns:
      Process 0's :class:`~ensemble_core.runs.results.TrainingSummary`.

    Raises:
      PreemptedError: a process died (killed, out of memory) or a stop was asked; the
        others were stopped within ``HEARTBEAT_TIMEOUT_S + EXIT_GRACE_S`` seconds.
      EnsembleError: a process refused the run (its one-line message).
      MeshError: the mesh leaves a process without devices (:func:`check_mesh_spans_processes`).
    """
    n = cfg.distributed.num_processes
    check_mesh_spans_processes(cfg)
    run = RunDir(Path(run_dir))
    run.path.mkdir(parents=True, exist_ok=True)
    with (
        run_lock(run.path),
        stopping.stop_signals(),
        tempfile.TemporaryDirectory(prefix="ensemble-processes-") as tmp,
    ):
        spec = Path(tmp) / "spec.json"
        inputs = {"config": cfg.model_dump(mode="json"), "dataset": dataset.model_dump(mode="json")}
        spec.write_text(json.dumps(inputs))
        coordinator = f"127.0.0.1:{free_port()}"
        run.processes_dir.mkdir(exist_ok=True)
        procs, logs = [], [_open_log(run.process_log(p)) for p in range(n)]
        for p, (log, _) in enumerate(logs):
            cmd = [sys.executable, "-m", "ensemble_core.runs.training.processes", str(run.path), "--spec", str(spec)]
            cmd += ["--coordinator", coordinator, "--num-processes", str(n), "--process-id", str(p)]
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=_child_env(n),
                    stdout=subprocess.PIPE if p == 0 else subprocess.DEVNULL,
                    stderr=log,
                    text=True,
                )
            )
        records: list[dict] = []
        reader = _start_reader(procs[0].stdout, records, on_epoch)
        try:
            stop = stopping.requested
            failed = _supervise(procs, lambda: stop() is not None or (should_stop is not None and should_stop()))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            reader.join(timeout=10)
            tails = [_read_log(log, start) for log, start in logs]
        if failed is not None:
            raise _failure(failed, procs, tails, run)
        summary = next((r["summary"] for r in records if "summary" in r), None)
        if summary is None:
            raise PreemptedError(
                f"process 0 of {n} ended without a training summary ({_explaining_line(tails[0])}; log: "
                f"{run.process_log(0)})",
                fix=resume_fix(owning_run(run.path).name),
            )
        return TrainingSummary.model_validate(summary)


def _start_reader(stream, records: list[dict], on_epoch) -> threading.Thread:
    """A daemon thread appending process 0's JSON lines from ``stream`` to ``records`` and
    calling ``on_epoch`` with each epoch record, in a copy of the caller's context.

    The context matters: a new thread starts with empty context variables, and there
    Prefect's logger (the flow's ``on_epoch``) found no API URL, started a second
    temporary Prefect server per run, which failed to bind its port and printed uvicorn's
    traceback into the flow's output.
    """
    forward = contextvars.copy_context().run
    reader = threading.Thread(target=forward, args=(_forward, stream, records, on_epoch), daemon=True)
    reader.start()
    return reader


def _forward(stream, records: list[dict], on_epoch) -> None:
    for line in stream:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):  # another line that happens to parse (a number)
            continue
        records.append(record)
        if "epoch_record" in record and on_epoch is not None:
            on_epoch(record["epoch_record"])


def _supervise(procs: list[subprocess.Popen], should_stop) -> tuple[str, list[int]] | None:
    """Wait for every process; the first failure ``(why, indices of the processes found
    dead first)`` or None."""
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return None
        bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
        stop = should_stop is not None and should_stop()
        if bad or stop:
            deadline = time.monotonic() + (0 if stop else HEARTBEAT_TIMEOUT_S + EXIT_GRACE_S)
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.2)
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
            return ("stop", []) if stop and not bad else ("died", bad)
        time.sleep(0.2)


def _open_log(path: Path) -> tuple[BinaryIO, int]:
    """Open JAX process log ``path`` for appending (the child writes its stderr straight
    into it, so whatever kills it, what it wrote is there) after a session header; returns
    the file and where this session starts."""
    log = open(path, "ab")  # noqa: SIM115  (closed by _read_log)
    start = log.tell()
    log.write(f"== session started {time.strftime('%Y-%m-%d %H:%M:%S')} (launcher pid {os.getpid()})\n".encode())
    log.flush()
    return log, start


def _read_log(log: BinaryIO, start: int) -> str:
    """This session's part of a log opened by :func:`_open_log`, and close it."""
    with log, open(log.name, "rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace")


# What explains a failure, best first: the child's own one-line refusal, a Python
# exception line (``ValueError: ...``, ``jax.errors.JaxRuntimeError: ...``), an absl/XLA
# fatal check failure (``F0101 12:00:00.000000  123 file.cc:45] ...``), an absl/XLA error.
# Native stack frames (``@ 0x7f... (unknown)``) and ``*** SIGABRT received`` never do.
_EXPLAINING = (
    re.compile(r"^error: (?P<line>.+)"),
    re.compile(r"^(?P<line>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?::.*)?)$"),
    re.compile(r"^(?P<line>F\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] .+)"),
    re.compile(r"^(?P<line>E\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] .+)"),
)


def _explaining_line(text: str) -> str:
    """The line of a process log that explains how the process ended: the last line of
    the best kind in ``_EXPLAINING``, else the last line that is no native stack frame,
    shortened to 400 characters; ``(an empty log)`` when there is none."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("== session started")]
    for pattern in _EXPLAINING:
        for ln in reversed(lines):
            if m := pattern.match(ln):
                return _shorten(m["line"])
    plain = [
        ln
        for ln in lines
        if not re.match(r"^(@ 0x|\*\*\* |PC: @|\s*(File|Fatal Python error|Thread|Current thread)\b)", ln)
    ]
    return _shorten(plain[-1]) if plain else "(an empty log)"


def _shorten(line: str, limit: int = 400) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


# A process that failed because another one died first (gloo's collective lost its peer:
# an error from its TCP transport, ``[enforce fail at .../gloo/transport/tcp/pair.cc:...]``
# included; the coordination service saw missed heartbeats): never the one to blame when
# another process died in the same poll.
_CONSEQUENCE = re.compile(
    r"Gloo \w+ failed|gloo/transport/|Connection (closed|reset) by peer|another task died|heartbeat timeout"
)


def _blamed(dead: list[int], codes: list[int | None], tails: list[str]) -> int:
    """Which of the processes ``dead`` (indices, in the order found dead) to blame: first
    one whose log shows no consequence of another's death (``_CONSEQUENCE``), and among
    those one ended from outside (SIGKILL, SIGTERM: the OOM killer, a user) before one that
    aborted itself (SIGABRT); ``dead[0]`` when every one is a consequence."""

    def rank(i: int) -> tuple[bool, bool]:
        return bool(_CONSEQUENCE.search(_explaining_line(tails[i]))), codes[i] == -signal.SIGABRT

    return min(dead, key=rank)


def _failure(failed: tuple[str, list[int]], procs, tails: list[str], run: RunDir) -> EnsembleError:
    why, dead = failed
    n = len(procs)
    if why == "stop":
        return PreemptedError(
            f"training across {n} JAX processes was stopped; the latest epoch checkpoint is kept",
            fix=resume_fix(owning_run(run.path).name),
        )
    index = _blamed(dead, [p.returncode for p in procs], tails)
    code = procs[index].returncode
    refused = [m["line"] for t in tails for m in [re.search(r"^error: (?P<line>.+)$", t, re.M)] if m]
    if code == 2 and refused:
        return EnsembleError(refused[0])
    cause = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return PreemptedError(
        f"JAX process {index} of {n} {cause} ({_explaining_line(tails[index])}; log: {run.process_log(index)}); "
        f"the other processes were stopped",
        fix=f"{resume_fix(owning_run(run.path).name)} from the latest checkpoint",
    )
