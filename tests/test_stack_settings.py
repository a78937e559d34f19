"""The local stack leaves the user's settings alone, and its data where it can be removed.

`make serve` no longer writes PREFECT_API_URL into the user's Prefect profile: the user
reaches the stack through .serve/env (scripts/deployment-run.sh reads it; `source .serve/env`
in a shell), which `make stop` removes. A real stack's start and stop are checked in
tests/prefect_stack.py's stack() (every module that starts one: `prefect config view` and
the profiles file as before `make serve`, the database in the serve directory, removed by
`make clean-stack`); here, the pieces without a stack.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.prefect_stack import ROOT


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    """A user's shell: no Prefect server configured, their Prefect home and the stack's
    serve directory under ``tmp``."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "ENSEMBLE_PGDATA"},
        "PREFECT_HOME": str(tmp / "prefect-home"),
        "ENSEMBLE_SERVE_DIR": str(tmp / "serve"),
        "ENSEMBLE_VENV": str(Path(sys.executable).parent.parent),
        "COLUMNS": "400",
        **extra,
    }


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _stopped_stack(tmp: Path) -> Path:
    """The serve directory a stopped stack leaves: logs, the database's location, and a
    data directory (PG_VERSION marks one)."""
    serve = tmp / "serve"
    (serve / "postgres").mkdir(parents=True)
    (serve / "postgres" / "PG_VERSION").write_text("18\n")
    (serve / "postgres.dir").write_text(f"{serve / 'postgres'}\n")
    for name in ("server", "worker", "reconciler", "postgres"):
        (serve / f"{name}.log").write_text("==== started by scripts/serve.sh ====\n")
    return serve


def test_clean_stack_refuses_while_the_stack_runs(tmp_path):
    """`make clean-stack` with a live server: one line naming it, exit 2, nothing removed."""
    serve = _stopped_stack(tmp_path)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (serve / "server.pid").write_text(f"{sleeper.pid}\n")
        proc = _run(["make", "-s", "clean-stack"], _env(tmp_path))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: the stack is running: server (pid {sleeper.pid}); fix: make stop" in proc.stderr
    assert (serve / "postgres" / "PG_VERSION").exists() and (serve / "server.log").exists()


def test_clean_stack_removes_the_database_and_the_logs(tmp_path):
    """`make clean-stack` on a stopped stack: the data directory (where postgres.dir says,
    here outside the serve directory too) and the stack's files go; a file of the user's in
    the serve directory, and a directory that is not a cluster, stay."""
    serve = _stopped_stack(tmp_path)
    elsewhere = tmp_path / "pg-elsewhere"
    elsewhere.mkdir()
    (elsewhere / "PG_VERSION").write_text("18\n")
    (serve / "postgres.dir").write_text(f"{elsewhere}\n")
    (serve / "notes.txt").write_text("mine\n")
    proc = _run(["make", "-s", "clean-stack"], _env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not elsewhere.exists() and not (serve / "postgres").exists()
    assert sorted(p.name for p in serve.iterdir()) == ["notes.txt"]

    not_a_cluster = tmp_path / "not-a-cluster"
    not_a_cluster.mkdir()
    (not_a_cluster / "data.csv").write_text("1,2\n")
    (serve / "postgres.dir").write_text(f"{not_a_cluster}\n")
    proc = _run(["make", "-s", "clean-stack"], _env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (not_a_cluster / "data.csv").exists()
    assert f"warning: {not_a_cluster} is not a PostgreSQL data directory (no PG_VERSION); left alone" in proc.stderr


@pytest.mark.slow  # three Python processes that import Prefect
def test_deployment_run_reaches_the_stack_of_serve_env(tmp_path):
    """scripts/deployment-run.sh: the server of .serve/env when the shell has none; the
    shell's PREFECT_API_URL first; with neither (and none in the profile), one line that
    says to start the stack instead of a run on a temporary server without deployments."""
    serve = tmp_path / "serve"
    serve.mkdir()
    (serve / "env").write_text("export PREFECT_API_URL=http://127.0.0.1:9/api\n")
    proc = _run(["scripts/deployment-run.sh", "train-ensemble/adhoc"], _env(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error: the Prefect server at http://127.0.0.1:9/api does not answer" in proc.stderr

    proc = _run(
        ["scripts/deployment-run.sh", "train-ensemble/adhoc"], _env(tmp_path, PREFECT_API_URL="http://127.0.0.1:7/api")
    )
    assert proc.returncode == 2 and "error: the Prefect server at http://127.0.0.1:7/api" in proc.stderr, proc.stderr

    (serve / "env").unlink()
    proc = _run(["scripts/deployment-run.sh", "train-ensemble/adhoc"], _env(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: no Prefect server to run the deployment on"), proc.stderr
    assert "fix: start it with `make serve`" in proc.stderr


@pytest.mark.slow  # a Python process that imports Prefect
def test_stop_leaves_the_profile_and_notes_an_old_stack_url(tmp_path):
    """A profile that an earlier `make serve` pointed at 127.0.0.1:4200: `make stop` leaves
    the file as it is and says, in one line, how to unset it."""
    home = tmp_path / "prefect-home"
    home.mkdir()
    profiles = b'active = "default"\n\n[profiles.default]\nPREFECT_API_URL = "http://127.0.0.1:4200/api"\n'
    (home / "profiles.toml").write_bytes(profiles)
    proc = _run(["scripts/stop.sh"], _env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (home / "profiles.toml").read_bytes() == profiles
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note:")]
    assert len(notes) == 1, proc.stdout
    assert "PREFECT_API_URL=http://127.0.0.1:4200/api" in notes[0]
    assert notes[0].endswith(".venv/bin/prefect config unset PREFECT_API_URL -y")
