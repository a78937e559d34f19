"""Where a command's machine time goes, by kind of process: a sampler of ``/proc``.

``benchmarks/suite.py`` runs it around ``.ci/run``: the suite's own per-test figures count
a test's process and the children it reaped, which leaves out every process nobody waits
for (the Prefect servers of the deployment tests, their flow-run processes, PostgreSQL,
Dask) and charges a child reaped late to whichever test was running then. The sampler
reads every process's CPU seconds (``/proc/<pid>/stat``: user + system) every
``interval_s`` and keeps, per process (pid and start time), the last value it saw; the
kinds are told apart by command line (:func:`kind_of`).

A process that starts and ends between two samples is missed (its CPU stays in the
machine's total and in its parent's reaped children, not here): the figures are a lower
bound per kind, and ``unsampled_s`` in ``benchmarks/suite.py``'s rows is the machine's CPU
seconds the samples did not see.
"""

from __future__ import annotations

import os
import re
import resource
import threading
from pathlib import Path

#: (kind, pattern of the command line), first match wins
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("busy core", r"-c while True: pass"),
        ("pytest-xdist worker", r"-c import sys;exec\(eval\(sys\.stdin"),
        ("pytest controller", r"-m pytest\b"),
        ("temporary Prefect server of a command", r"flows\.ephemeral:create_app"),
        ("Prefect API server", r"prefect\.server\.api\.server:create_app|prefect server start"),
        ("Prefect flow-run process (deployments)", r"prefect\.runner\._workspace_supervisor|-m prefect\.engine"),
        ("Prefect CLI (deploy, worker, ...)", r"bin/prefect |deployment-run\.sh|from prefect\.cli import app"),
        ("command line (python -m flows.*)", r"-m flows\."),
        ("JAX training process", r"-m (ensemble_core\.runs\.training\.processes|tests\.train_proc|tests\.stop_proc)"),
        ("Dask", r"distributed\.cli|multiprocessing\.spawn|multiprocessing-fork"),
        ("PostgreSQL", r"postgres"),
        ("pip and setup", r"-m pip\b|compileall|\bpip\b"),
        ("other Python", r"python"),
    )
)


def kind_of(cmdline: str) -> str:
    """The kind (:data:`KINDS`) of a process whose command line (arguments joined by
    spaces) is ``cmdline``; "other" for none."""
    for kind, pattern in KINDS:
        if pattern.search(cmdline):
            return kind
    return "other"


def _stat(proc_dir: str) -> tuple[float, int]:
    """CPU seconds (user + system) and start time (clock ticks since boot) of the process
    whose ``/proc`` folder is ``proc_dir``, from its ``stat`` file.

    Raises:
      FileNotFoundError, ProcessLookupError: the process has ended.
    """
    fields = Path(proc_dir, "stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[19])


def children_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's children that it has waited for
    (``RUSAGE_CHILDREN``: a ``subprocess.run`` and what that child reaped in turn); the
    difference around a ``subprocess.run`` is that command's."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (``/proc/<pid>/stat``).

    Raises:
      FileNotFoundError: no such process.
    """
    return _stat(f"/proc/{pid}")[0]


class ProcessSampler:
    """Every process's CPU seconds, sampled in a thread while a ``with`` block runs.

    Attributes:
      processes: ``{(pid, start ticks): {"cmdline": str, "cpu_s": float}}``, the last CPU
        seconds seen of each process alive at some sample.
    """

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.processes: dict[tuple[int, int], dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ProcessSampler:
        self._baseline = self._sample(record=False)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(record=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample(record=True)

    def _sample(self, record: bool) -> dict[tuple[int, int], float]:
        seen = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                cpu_s, start = _stat(entry.path)
                key = (int(entry.name), start)
                seen[key] = cpu_s
                if not record:
                    continue
                if key not in self.processes:
                    raw = Path(entry.path, "cmdline").read_bytes()
                    self.processes[key] = {"cmdline": raw.replace(b"\0", b" ").decode(errors="replace").strip()}
                self.processes[key]["cpu_s"] = cpu_s
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue  # ended between the listing and the read
        return seen

    def by_kind(self) -> dict[str, dict]:
        """``{kind: {"cpu_s": float, "processes": int}}``, most CPU first: the CPU seconds
        each process used while sampled (what it had used before the block started left
        out), summed by :func:`kind_of`. Processes with no command line (kernel threads)
        and that used nothing are left out."""
        out: dict[str, dict] = {}
        for key, p in self.processes.items():
            used = p["cpu_s"] - self._baseline.get(key, 0.0)
            if not p["cmdline"] or used <= 0:
                continue
            row = out.setdefault(kind_of(p["cmdline"]), {"cpu_s": 0.0, "processes": 0})
            row["cpu_s"] += used
            row["processes"] += 1
        ordered = sorted(out.items(), key=lambda kv: -kv[1]["cpu_s"])
        return {k: {"cpu_s": round(v["cpu_s"], 1), "processes": v["processes"]} for k, v in ordered}
