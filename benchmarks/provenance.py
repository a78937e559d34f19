"""The ``date``, ``machine`` and ``commit`` fields every result file carries, and how busy
the machine was while a benchmark timed (:func:`busy_seconds`).

``benchmarks.docs_figures`` refuses a marker whose result file lacks ``date`` or
``machine``, so each benchmark that writes a result file puts :func:`stamp` into it.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict:
    """The machine a measurement ran on: OS, processor and CPU count."""
    return {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()}


def commit() -> str | None:
    """The checked-out commit (short hash, ``-dirty`` when the work tree differs), or None."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = ["git", "status", "--porcelain", "--untracked-files=no"]
        dirty = subprocess.run(status, cwd=ROOT, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty.stdout.strip() else "")


def stamp() -> dict:
    """``date`` (UTC, ISO), ``machine`` and ``commit`` of a measurement taken now."""
    return {"date": datetime.datetime.now(datetime.UTC).date().isoformat(), "machine": machine(), "commit": commit()}


def busy_seconds() -> float | None:
    """CPU seconds the whole machine has been busy (``/proc/stat``: user, nice, system, irq,
    softirq and steal over all cores), or None where there is no ``/proc/stat``: read
    before and after a timing, it tells how busy the other cores were."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
