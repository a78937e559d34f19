"""A private Prefect stack of ``scripts/serve.sh`` (server on PostgreSQL, work pool,
deployments, automation, reconciler, worker) for the integration tests and the
benchmarks that drive it: its environment, start and stop, its API, and the processes of
its flow runs. Everything stays on loopback and in the given directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from ensemble_core.processutil import free_port

ROOT = Path(__file__).resolve().parents[1]
ZOMBIE_AFTER_S = 50  # the reconciler's heartbeat timeout here (heartbeats every 30 s, Prefect's minimum)


# The task runs of one training flow run, by their names in the Prefect UI.
TASK_NAMES = frozenset(
    {
        "prepare_dataset",
        "check_unchanged",
        "detect_drift",
        "train_members",
        "select_members",
        "evaluate_members",
        "compare_with_champion",
        "publish_report",
        "apply_retention",
    }
)


# Variables of the calling environment a stack does not inherit (where its state and database are).
OWN_VARIABLES = frozenset({"XLA_FLAGS", "ENSEMBLE_SERVE_DIR", "ENSEMBLE_PGDATA"})


def stack_env(tmp: Path, serve_dir: Path, zombie_after_s: float = ZOMBIE_AFTER_S, **extra: str) -> dict[str, str]:
    """The environment of a stack under ``tmp`` on a free port, its state (and database, in
    ``serve_dir/postgres``) in ``serve_dir``, with ``extra`` variables on top. The user's
    Prefect home is ``tmp/prefect-home``."""
    port = free_port()
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k not in OWN_VARIABLES},
        "PREFECT_HOME": str(tmp / "prefect-home"),
        "PREFECT_PORT": str(port),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5",
        "ENSEMBLE_SERVE_DIR": str(serve_dir),
        "ENSEMBLE_DB": "postgres",
        "ENSEMBLE_VENV": str(Path(sys.executable).parent.parent),
        "ENSEMBLE_ZOMBIE_AFTER_S": str(zombie_after_s),
        "JAX_COMPILATION_CACHE_DIR": str(tmp / "jax-cache"),
        **extra,
    }


# The user's Prefect profile in a stack's environment: make serve and make stop must leave it
# (and so `prefect config view`) as it was.
USER_PROFILES = b"""active = "mine"

[profiles.mine]
PREFECT_CLIENT_MAX_RETRIES = "5"
"""


def user_settings(env: dict[str, str]) -> tuple[str, bytes]:
    """What the user of the stack's environment sees of their Prefect settings, in a shell
    that never sourced .serve/env: ``prefect config view`` and their profiles file."""
    shell = {k: v for k, v in env.items() if k != "PREFECT_API_URL"} | {"COLUMNS": "400"}
    view = _run([str(Path(env["ENSEMBLE_VENV"]) / "bin" / "prefect"), "config", "view"], shell, timeout=120)
    assert view.returncode == 0, view.stdout + view.stderr
    return view.stdout, (Path(env["PREFECT_HOME"]) / "profiles.toml").read_bytes()


def serve(env: dict[str, str]) -> None:
    """``scripts/serve.sh``: start what is not running.

    Raises:
      RuntimeError: it failed (its exit code and the last lines of its output).
    """
    proc = subprocess.run(["scripts/serve.sh"], cwd=ROOT, env=env, timeout=300, capture_output=True, text=True)
    if proc.returncode:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"scripts/serve.sh exited with {proc.returncode}:\n{tail}")


@contextmanager
def stack(tmp: Path, **env_options) -> Iterator[dict[str, str]]:  # env_options: of stack_env
    """A started stack under ``tmp`` (yields its environment); stopped by scripts/stop.sh
    and removed by ``make clean-stack`` at exit, as a user would.

    Its serve directory (``tmp/serve`` links to it) is in a short path that the cluster's
    own user can reach when this runs as root (a parent of mode 0711), so that the
    database is where ``make serve`` puts it, in ``serve/postgres``. The user's Prefect
    home holds a profile of theirs (:data:`USER_PROFILES`). At a normal exit, AssertionError
    unless ``prefect config view`` and the profiles file are as before ``make serve``, the
    database was in the serve directory and ``make clean-stack`` removed it; the logs stay
    in ``tmp/serve-logs``."""
    base = Path(tempfile.mkdtemp(prefix="ensemble-stack-"))
    base.chmod(0o711)
    serve_dir = base / "serve"
    link = tmp / "serve"  # benchmarks/soak.py reads tmp/serve
    tmp.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        link.unlink()
    if not link.exists():
        link.symlink_to(serve_dir)
    env = stack_env(tmp, serve_dir, **env_options)
    home = Path(env["PREFECT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "profiles.toml").write_bytes(USER_PROFILES)
    before = user_settings(env)
    try:
        serve(env)
        yield env
    finally:
        stopped = _run(["scripts/stop.sh"], env, timeout=300)
        where = serve_dir / "postgres.dir"
        pgdata = Path(where.read_text().strip()) if where.exists() else None
        if serve_dir.exists():
            shutil.copytree(
                serve_dir, tmp / "serve-logs", ignore=shutil.ignore_patterns("postgres"), dirs_exist_ok=True
            )
        cleaned = _run(["make", "-s", "clean-stack"], env, timeout=120)
        shutil.rmtree(base, ignore_errors=True)
    # Reached only when the body did not raise: the checks of the stack's own traces.
    after = user_settings(env)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert after == before, f"make serve/make stop changed the user's Prefect settings:\n{before}\n---\n{after}"
    assert pgdata == serve_dir / "postgres", f"the database was in {pgdata}, not in the serve directory {serve_dir}"
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert not pgdata.exists() and not serve_dir.exists(), cleaned.stdout


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, capture_output=True, text=True)


def api(env: dict[str, str], method: str, path: str, body=None):
    """One call of the stack's REST API; the decoded JSON answer (None if empty)."""
    r = httpx.request(method, env["PREFECT_API_URL"] + path, json=body, timeout=30)
    r.raise_for_status()
    return r.json() if r.content else None


def small_params(tmp: Path, out: str = "runs", epochs: int = 2, **train) -> dict:
    """Deployment parameters of a run of a few seconds (4 MLPs, 512 digits, test split only,
    no figures)."""
    config = {
        "data": {"data_dir": str(tmp / "tfds"), "max_train_examples": 512, "max_test_examples": 200},
        "model": {"name": "mlp", "hidden_sizes": [64]},
        "ensemble": {"size": 4},
        "train": {"epochs": epochs, "batch_size": 64, **train},
        "eval": {"evaluators": ["test"], "plots": False},
    }
    return {"config": config, "output_dir": str(tmp / out)}


def deployment_run(env, params, *extra, deployment="train-ensemble/adhoc", watch=True):
    """``scripts/deployment-run.sh`` (``prefect deployment run``) with ``params``."""
    cmd = ["scripts/deployment-run.sh", deployment, "--params", json.dumps(params), *extra]
    if watch:
        cmd += ["--watch", "--watch-timeout", "400"]
    # A wide console: rich would wrap the one-line error at 80 columns.
    return subprocess.run(cmd, cwd=ROOT, env={**env, "COLUMNS": "400"}, capture_output=True, text=True, timeout=450)


def run_id_of(proc) -> str:
    """The flow run id that ``prefect deployment run`` printed."""
    return next(line.split("UUID:")[1].strip() for line in proc.stdout.splitlines() if "UUID:" in line)


def engine_pids(env: dict[str, str], run_id: str | None = None) -> list[int]:
    """pids of live flow-run processes of this stack (by their PREFECT_API_URL), or of
    the flow run ``run_id`` only."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"prefect.engine" not in (proc / "cmdline").read_bytes():
                continue
            environ = (proc / "environ").read_bytes().split(b"\0")
            if f"PREFECT_API_URL={env['PREFECT_API_URL']}".encode() not in environ:
                continue
            if run_id is None or f"PREFECT__FLOW_RUN_ID={run_id}".encode() in environ:
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def wait_until(predicate, timeout: float, what: str, every: float = 2.0):
    """The first truthy value of ``predicate()``; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (or is a zombie waiting for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def kill_group(pid_file: Path) -> None:
    """SIGKILL the process group whose leader's pid ``pid_file`` holds; wait for it."""
    pid = int(pid_file.read_text())
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: gone(pid), 30, f"pid {pid} to die", every=0.2)


def kill_stack(env: dict[str, str]) -> None:
    """SIGKILL everything of the stack, as a lost machine: its flow-run processes, worker,
    reconciler, server and PostgreSQL (the postmaster)."""
    serve_dir = Path(env["ENSEMBLE_SERVE_DIR"])
    for pid in engine_pids(env):
        os.kill(pid, signal.SIGKILL)
    for name in ("worker", "reconciler", "server"):
        kill_group(serve_dir / f"{name}.pid")
    # PostgreSQL: the postmaster and its server processes at once, as a machine loss does
    # (a backend left alive holds the shared memory, and the next start refuses it).
    pgdata = Path((serve_dir / "postgres.dir").read_text().strip())
    postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    pids = [postmaster, *_children(postmaster)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # a server process that exited since it was listed
            os.kill(pid, signal.SIGKILL)
    # Until reaped, not only dead: pg_ctl takes a zombie postmaster for a running server.
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), 60, "PostgreSQL to be reaped", every=0.2)


def _children(pid: int) -> list[int]:
    """pids of the live child processes of ``pid``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def state_names(env: dict[str, str], run_id: str) -> list[str]:
    """The types of the flow run's states, oldest first."""
    return [s["type"] for s in api(env, "GET", f"/flow_run_states/?flow_run_id={run_id}")]


def heartbeats(env: dict[str, str], run_id: str) -> int:
    """How many heartbeat events of the flow run the server has stored."""
    body = {
        "filter": {
            "event": {"name": ["prefect.flow-run.heartbeat"]},
            "resource": {"id": [f"prefect.flow-run.{run_id}"]},
        }
    }
    return len(api(env, "POST", "/events/filter", body)["events"])


def start_long_run(env: dict[str, str], tmp: Path, out: str, epochs: int = 12) -> str:
    """Submit a run of about 1 s an epoch; return its id once it has saved its first
    checkpoint and the server holds a heartbeat of it (the reconciler leaves runs that
    never sent one alone)."""
    params = small_params(tmp, out=out, epochs=epochs)
    params["config"]["data"]["max_train_examples"] = 2048
    params["config"]["model"]["hidden_sizes"] = [512, 512]
    proc = deployment_run(env, params, watch=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run_id = run_id_of(proc)

    def checkpointed():
        return any(p.name.isdigit() for p in (tmp / out).glob("*/checkpoints/*"))

    wait_until(checkpointed, 300, "the first checkpoint", every=0.5)
    wait_until(lambda: heartbeats(env, run_id) >= 1, 120, "a heartbeat of the run", every=0.5)
    assert api(env, "GET", f"/flow_runs/{run_id}")["state_type"] == "RUNNING"
    return run_id
