"""The ``date``, ``machine`` and ``commit`` fields every result file carries.

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
