"""The suite's own measurement (a pytest plugin of ``tests/conftest.py``).

With ``ENSEMBLE_SUITE_REPORT=<path>.json`` in the environment, every test's wall time and
CPU seconds (this process and the child processes it reaped: setup and teardown
included), its start (Unix time) and pytest-xdist worker, its outcome and its
``slow``/``soak`` markers are recorded (the starts and workers give the suite's timeline:
which worker ran what when); each pytest-xdist
worker writes its records beside the report and the controlling process merges them
into ``<path>.json``. ``benchmarks/suite.py`` (``make test``'s figures) and
``benchmarks/soak_suite.py`` (``make soak``'s) read it. Without the variable nothing is
recorded.
"""

import json
import os
import resource
import time
from pathlib import Path

import pytest


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


_RECORDS: list[dict] = []
_OUTCOMES: dict[str, str] = {}  # nodeid -> passed / failed / skipped (failed if any phase failed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not os.environ.get("ENSEMBLE_SUITE_REPORT"):
        yield
        return
    start, wall, cpu = time.time(), time.monotonic(), _cpu_s()
    yield
    _RECORDS.append(
        {
            "test": item.nodeid,
            "start": round(start, 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "wall_s": round(time.monotonic() - wall, 3),
            "cpu_s": round(_cpu_s() - cpu, 3),
            "markers": sorted({m.name for m in item.iter_markers()} & {"slow", "soak"}),
            "outcome": _OUTCOMES.get(item.nodeid, "passed"),
        }
    )


def pytest_runtest_logreport(report):
    failed_before = _OUTCOMES.get(report.nodeid) == "failed"
    if os.environ.get("ENSEMBLE_SUITE_REPORT") and not failed_before and (report.failed or report.skipped):
        _OUTCOMES[report.nodeid] = report.outcome


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("ENSEMBLE_SUITE_REPORT")
    if not path:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # a worker: its records beside the report, for the controller to merge
        with open(f"{path}.{worker}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in _RECORDS)
        return
    records = list(_RECORDS)
    for part in sorted(Path(path).parent.glob(Path(path).name + ".*.jsonl")):
        records += [json.loads(line) for line in part.read_text().splitlines() if line]
        part.unlink()
    Path(path).write_text(json.dumps({"exitstatus": int(exitstatus), "records": records}, indent=1) + "\n")
