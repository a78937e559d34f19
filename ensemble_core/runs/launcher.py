"""The launcher of one program across JAX processes on this machine (loopback).

:func:`train_processes` holds the run directory's lock, starts N child processes of
:mod:`ensemble_core.runs.processes` (``python -m ensemble_core.runs.processes``, each
with ``8 // N`` simulated CPU devices), forwards process 0's epoch records, reads its
summary back, and stops the others when one dies. Kept apart from the child program so
that importing :mod:`ensemble_core.runs` never imports the module ``python -m`` runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ensemble_core import stopping
from ensemble_core.config import HOST_DEVICES, PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.errors import EnsembleError, PreemptedError
from ensemble_core.processutil import free_port
from ensemble_core.runs.layout import RunDir
from ensemble_core.runs.lock import run_lock
from ensemble_core.runs.results import TrainingSummary

HEARTBEAT_TIMEOUT_S = 10  # a process that misses heartbeats this long is declared dead
EXIT_GRACE_S = 30  # then the launcher waits this long for the others before killing them
INIT_TIMEOUT_S = 120  # every process must have joined within this
_DEVICE_FLAG = "--xla_force_host_platform_device_count"


def local_devices(num_processes: int) -> int:
    """Simulated CPU devices per process when N processes share one machine."""
    return HOST_DEVICES // num_processes


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
    keys: dict,
    run_dir: str | Path,
    *,
    on_epoch: Callable[[dict], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrainingSummary:
    """Train the ensemble as one program across ``distributed.num_processes`` JAX
    processes on this machine (loopback), holding the run directory's lock meanwhile.

    Args:
      keys: :func:`ensemble_core.runs.keys.split_keys` for the whole mesh.
      on_epoch: called with process 0's epoch records as they come.
      should_stop: polled every 0.2 s; True (or SIGTERM/SIGINT in the main thread) stops
        every process (SIGKILL: the run resumes from its latest checkpoint, as after a crash).

    Returns:
      Process 0's :class:`~ensemble_core.runs.results.TrainingSummary`.

    Raises:
      PreemptedError: a process died (killed, out of memory) or a stop was asked; the
        others were stopped within ``HEARTBEAT_TIMEOUT_S + EXIT_GRACE_S`` seconds.
      EnsembleError: a process refused the run (its one-line message).
    """
    n = cfg.distributed.num_processes
    run = RunDir(Path(run_dir))
    run.path.mkdir(parents=True, exist_ok=True)
    with (
        run_lock(run.path),
        stopping.stop_signals(),
        tempfile.TemporaryDirectory(prefix="ensemble-processes-") as tmp,
    ):
        spec = Path(tmp) / "spec.json"
        inputs = {"config": cfg.model_dump(mode="json"), "dataset": dataset.model_dump(mode="json"), "keys": keys}
        spec.write_text(json.dumps(inputs))
        coordinator = f"127.0.0.1:{free_port()}"
        procs, logs = [], []
        for p in range(n):
            log = open(Path(tmp) / f"process-{p}.log", "w+")  # noqa: SIM115  (closed below)
            cmd = [sys.executable, "-m", "ensemble_core.runs.processes", str(run.path), "--spec", str(spec)]
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
            logs.append(log)
        records: list[dict] = []
        reader = threading.Thread(target=_forward, args=(procs[0].stdout, records, on_epoch), daemon=True)
        reader.start()
        try:
            stop = stopping.requested
            failed = _supervise(procs, lambda: stop() is not None or (should_stop is not None and should_stop()))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            reader.join(timeout=10)
            tails = []
            for log in logs:
                log.seek(0)
                tails.append(log.read())
                log.close()
        if failed is not None:
            raise _failure(failed, procs, tails, run)
        summary = next((r["summary"] for r in records if "summary" in r), None)
        if summary is None:
            raise PreemptedError(
                f"process 0 of {n} ended without a training summary; its log ends: {_last_line(tails[0])}; "
                f"fix: rerun with the same run name to resume"
            )
        return TrainingSummary.model_validate(summary)


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


def _supervise(procs: list[subprocess.Popen], should_stop) -> tuple[str, int] | None:
    """Wait for every process; the first failure ``(why, process index)`` or None."""
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
            return ("stop", -1) if stop and not bad else ("died", bad[0])
        time.sleep(0.2)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("error: "):
            return ln[len("error: ") :]
    return lines[-1][:300] if lines else "(nothing)"


def _failure(failed: tuple[str, int], procs, tails: list[str], run: RunDir) -> EnsembleError:
    why, index = failed
    n = len(procs)
    if why == "stop":
        return PreemptedError(
            f"training across {n} JAX processes was stopped; the latest epoch checkpoint is kept; "
            f"fix: rerun with the same run name (run_name {run.name}) to resume"
        )
    code = procs[index].returncode
    refused = [_last_line(t) for t in tails if "\nerror: " in "\n" + t]
    if code == 2 and refused:
        return EnsembleError(refused[0])
    cause = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return PreemptedError(
        f"JAX process {index} of {n} {cause} (its log ends: {_last_line(tails[index])}); the other processes were "
        f"stopped; fix: rerun with the same run name (run_name {run.name}) to resume from the latest checkpoint"
    )
