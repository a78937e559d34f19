"""benchmarks/process_cpu.py: the suite's machine time by kind of process."""

import json
import subprocess
import sys

import pytest

from benchmarks.process_cpu import ProcessSampler, kind_of

BURN = """import resource, time
t = time.process_time()
while time.process_time() - t < 1.0:
    pass
u = resource.getrusage(resource.RUSAGE_SELF)
print(u.ru_utime + u.ru_stime)
time.sleep(0.5)
"""


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        ("/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))", "pytest-xdist worker"),
        (
            "/v/bin/python -m uvicorn --app-dir /r --factory flows.ephemeral:create_app --port 1",
            "temporary Prefect server of a command",
        ),
        ("/v/bin/python /v/bin/prefect server start --host 127.0.0.1 --port 4200", "Prefect API server"),
        ("/v/bin/python -m uvicorn --factory prefect.server.api.server:create_app --port 2", "Prefect API server"),
        ("/v/bin/python -m prefect.runner._workspace_supervisor /tmp/s.json", "Prefect flow-run process (deployments)"),
        ("/bin/bash scripts/deployment-run.sh train-ensemble/adhoc --watch", "Prefect CLI (deploy, worker, ...)"),
        (
            "/v/bin/python -c import sys ... from prefect.cli import app ... .serve train-ensemble/adhoc",
            "Prefect CLI (deploy, worker, ...)",
        ),
        ("/v/bin/python -m flows.train_ensemble --config configs/tiny.yaml", "command line (python -m flows.*)"),
        ("/v/bin/python -m ensemble_core.runs.training.processes /r --spec s", "JAX training process"),
        ("/usr/lib/postgresql/bin/postgres -D /x", "PostgreSQL"),
        ("/bin/sleep 1", "other"),
    ],
)
def test_each_kind_by_its_command_line(cmdline, kind):
    assert kind_of(cmdline) == kind


def test_a_sampled_process_is_counted_with_the_cpu_it_reports_itself():
    """A child burning a second of CPU, sampled from /proc while it runs (whoever reaps
    it): the CPU seconds recorded for it are what the child measured of itself
    (``getrusage``), within a sample's rounding, and its kind counts it."""
    with ProcessSampler(interval_s=0.1) as sampler:
        proc = subprocess.run([sys.executable, "-c", BURN], capture_output=True, text=True, check=True)
    own = float(proc.stdout)
    rows = sampler.by_kind()
    assert rows["other Python"]["processes"] >= 1
    mine = [p for p in sampler.processes.values() if "process_time" in p["cmdline"]]
    assert len(mine) == 1 and mine[0]["cpu_s"] == pytest.approx(own, abs=0.15), json.dumps(rows)
