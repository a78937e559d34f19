"""The command line as a process (``python -m flows.train_ensemble`` in a subprocess, with
its own temporary Prefect server): bad input is one line and exit code 2 before anything
is written; SIGTERM and SIGINT, once or twice, checkpoint and exit 75 with one line and
the rerun resumes; Ctrl-C while it starts is one line; kill -9 takes its temporary
server with it. The flow under Prefect, in this process, is tested in test_flow.py.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.prefect_api import cli_env

pytestmark = pytest.mark.slow  # CLIs in subprocesses, each with a temporary Prefect server

ROOT = Path(__file__).resolve().parents[1]


def _tiny(tfds_dir):
    return ["--config", str(ROOT / "configs" / "tiny.yaml"), "--set", f"data.data_dir={tfds_dir}"]


@pytest.mark.parametrize(
    "args, fragment, through",
    [
        (["--set", "train.learning_rate=-0.1"], "train.learning_rate", "process"),
        (["--set", "ensemble.size=0"], "ensemble.size", "main"),
        (["--set", "mesh.data=3"], "mesh.data=3 does not divide", "process"),
        (["--set", "mesh.ensemble=3", "--set", "ensemble.size=4"], "ensemble.pad=true", "main"),
        (["--config", "/nonexistent.yaml"], "cannot read config file", "main"),
        (["--set", "unknown.key=1"], "unknown config key 'unknown'", "main"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capfd, args, fragment, through, request):
    """Exit code 2, one ``error:`` line on stderr naming the problem, nothing written.
    ``process``: the command line in a subprocess (a config value and a preflight check,
    once each that way), on the session's Prefect server (a temporary one it started early
    and stopped at the refusal costs 4-8 CPU s: that is proved once, below); ``main``: its
    entry point, ``flows.train_ensemble.main``, in this process, which refuses before
    anything starts and spares a command line's start-up (about 4 CPU s) per case."""
    out = tmp_path / "runs"
    argv = [*args, "--output-dir", str(out)]
    if through == "main":
        from flows.train_ensemble import main

        capfd.readouterr()
        returncode, stderr = main(argv), capfd.readouterr().err
    else:
        cmd = [sys.executable, "-m", "flows.train_ensemble", *argv]
        env = cli_env(request.getfixturevalue("prefect_api"))  # the session's server: only the process cases need it
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        returncode, stderr = proc.returncode, proc.stderr
    assert returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], stderr
    assert not out.exists()  # nothing was written


@pytest.mark.parametrize(
    "signals",
    [
        ("SIGTERM",),
        ("SIGINT", "SIGTERM"),
        # make soak: the other two (covered once by the two above: each signal, and two at once)
        pytest.param(("SIGINT",), marks=pytest.mark.soak),
        pytest.param(("SIGTERM", "SIGTERM"), marks=pytest.mark.soak),
    ],
)
def test_cli_stop_signal_checkpoints_and_exits_75(tmp_path, tfds_dir, signals, prefect_api):
    """SIGTERM or SIGINT (Ctrl-C), once or twice in quick succession, while the CLI trains:
    a checkpoint is saved, the flow run ends Crashed (what the retry automation re-runs
    under a deployment), the command exits 75 at once (no retry, no sleep) with one line
    saying how to resume and no traceback; rerunning the same run name resumes and completes.

    Why not shorter (about a minute for SIGTERM under load): the command trains to its
    first checkpoint, stops, and its rerun resumes and completes."""
    import signal
    import time

    out = tmp_path / "runs"
    env = cli_env(prefect_api)  # the test process's Prefect server (its temporary one: below)
    cmd = [
        sys.executable,
        "-m",
        "flows.train_ensemble",
        *_tiny(tfds_dir),
        "--set",
        "train.epochs=12",  # 11 epochs (each a checkpoint save) left when the signal comes
        "--set",
        "eval.evaluators=[test]",  # the stop and the resume are the subject, not the evaluators
        "--output-dir",
        str(out),
        "--run-name",
        "term",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not any(p.name.isdigit() for p in (out / "term" / "checkpoints").glob("*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.2)
    for name in signals:
        proc.send_signal(getattr(signal, name))
        time.sleep(0.05)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-2000:]
    assert time.monotonic() - sent < 50  # no retry delay, no second training in-process
    line = [ln for ln in err.splitlines() if ln.startswith("error: ")][-1]
    assert "training stopped at epoch" in line and "--run-name term" in line, err[-3000:]
    assert "Traceback" not in err
    steps = sorted(int(p.name) for p in (out / "term" / "checkpoints").iterdir() if p.name.isdigit())
    assert steps and steps[-1] < 12 * 8  # stopped before the end (8 steps an epoch)
    if signals != ("SIGTERM",):
        return  # the resume itself is the same for every signal: shown once, below
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "term" / "report.json").read_text())
    assert report["resumed_from_epoch"] is not None


def _ephemeral_servers(parent_pid: int) -> list[int]:
    """pids of this project's temporary Prefect servers started by ``parent_pid``."""
    import os

    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            environ = (d / "environ").read_bytes()
        except OSError:
            continue
        if b"flows.ephemeral:create_app" in cmd and f"ENSEMBLE_EPHEMERAL_PARENT_PID={parent_pid}\0".encode() in environ:
            found.append(int(d.name))
    return [p for p in found if p != os.getpid()]


def test_cli_killed_leaves_no_temporary_server(tmp_path, tfds_dir):
    """kill -9 of a CLI run that uses a temporary Prefect server (no PREFECT_API_URL): the
    server process goes too (it was left behind, about 200 MB, one per killed command)."""
    import os
    import signal
    import time

    out = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    cmd = [sys.executable, "-m", "flows.train_ensemble", *_tiny(tfds_dir), "--set", "train.epochs=30"]
    proc = subprocess.Popen([*cmd, "--output-dir", str(out), "--run-name", "k"], cwd=ROOT, env=env)
    deadline = time.monotonic() + 180
    while not any(p.name.isdigit() for p in (out / "k" / "checkpoints").glob("*")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    servers = _ephemeral_servers(proc.pid)
    assert len(servers) == 1  # the run really used a temporary server of its own
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while Path(f"/proc/{servers[0]}").exists() and time.monotonic() < deadline:
        with open(f"/proc/{servers[0]}/stat") as f:
            if f.read().split()[2] == "Z":
                break
        time.sleep(0.2)
    alive = Path(f"/proc/{servers[0]}").exists() and Path(f"/proc/{servers[0]}/stat").read_text().split()[2] != "Z"
    assert not alive, f"temporary server {servers[0]} outlived its command"


def test_cli_interrupted_while_starting_is_one_line(tmp_path, tfds_dir):
    """Ctrl-C in the first second (modules still importing): one line, exit 75, nothing written."""
    import os
    import signal
    import time

    out = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.train_ensemble", *_tiny(tfds_dir), "--output-dir", str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-2000:]
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: stopped by SIGINT") and "fix:" in lines[-1] and "Traceback" not in err
    assert not out.exists()


def test_a_refused_command_stops_the_server_it_started_early(tmp_path):
    """The temporary server starts with the command (flows.ephemeral.start_early), before
    the input is checked: a command refused in its preflight stops it at exit."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    cmd = [sys.executable, "-m", "flows.train_ensemble", "--set", "train.lr=0.1", "--output-dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    started = []
    while proc.poll() is None:  # the server exists while the command imports and checks
        started = started or _ephemeral_servers(proc.pid)
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 2 and "unknown config key 'train.lr'" in err, err[-2000:]
    assert len(started) == 1, "no temporary server was started early"
    assert not [
        p for p in started if Path(f"/proc/{p}").exists() and Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"
    ]


def test_start_early_only_for_flow_commands_without_a_configured_server(monkeypatch):
    from flows import ephemeral

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert not ephemeral.start_early(["python", "-m", "flows.train_ensemble", "--help"])
    assert not ephemeral.start_early(["python", "-m", "flows.automations"])
    assert not ephemeral.start_early(["python", "script.py"])
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    assert not ephemeral.start_early(["python", "-m", "flows.predict", "--images", "x"])


HEARTBEAT_PROBE = """
import threading
from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from flows import ephemeral


def heartbeat_threads() -> int:
    # Prefect's flow-run heartbeat: a thread running heartbeat_loop (prefect/flow_engine.py)
    return sum(
        any(getattr(a, "__name__", "") == "heartbeat_loop" for a in getattr(t, "_args", ()))
        for t in threading.enumerate()
    )


@flow
def probe() -> int:
    return heartbeat_threads()


with ephemeral.temporary_server():
    inside = probe()
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
        control = probe()  # the probe sees a heartbeat where Prefect sends them
print(inside, control)
"""


def test_runs_on_the_temporary_server_send_no_heartbeats(tmp_path):
    """A flow run on the command's temporary server starts no heartbeat thread (nothing
    watches that server's runs, and Prefect's thread, sleeping in whole seconds, held each
    command up to a second at the flow's end); with heartbeats on, the same probe sees one."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    done = subprocess.run(
        [sys.executable, "-c", HEARTBEAT_PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "1"], done.stdout


WHILE_STARTING_PROBE = """
import os
import signal
import time
from pathlib import Path
from flows import ephemeral

calls = []
assert ephemeral.start_early(["python", "-m", "flows.train_ensemble"])
while ephemeral.while_starting(lambda: calls.append(1)):  # each True: the work was done
    time.sleep(0.1)
answered = len(calls)
# The server has answered. Stopped now (SIGSTOP), it cannot answer another health check in
# time, as a server busy on a loaded machine may not: it has started all the same.
(server,) = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
os.kill(int(server), signal.SIGSTOP)
try:
    called = ephemeral.while_starting(lambda: calls.append(1))
finally:
    os.kill(int(server), signal.SIGCONT)
with ephemeral.temporary_server():  # takes the server over; stops it at exit
    after = ephemeral.while_starting(lambda: calls.append(1))
print(answered, called, after, len(calls))
"""


def test_work_while_the_server_starts_is_done_only_while_it_does_not_answer(tmp_path):
    """``while_starting`` calls the work (the evaluation's imports) while the server started
    early does not answer yet, and not once it has answered, even when a later health check
    would not be answered in time (the server stopped with SIGSTOP; a CI run under load
    failed this way), nor once the command has taken the server over."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    done = subprocess.run(
        [sys.executable, "-c", WHILE_STARTING_PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answered, called, after, total = done.stdout.split()
    assert int(answered) >= 1 and called == "False" and after == "False" and int(total) == int(answered), done.stdout


BLOCKS_PROBE = """
import os

import httpx
from prefect import flow, task
from prefect.cache_policies import INPUTS
from prefect.client.orchestration import get_client
from flows import ephemeral

calls = []


@task(cache_policy=INPUTS, persist_result=True)
def square(x: int) -> int:
    calls.append(x)
    return x * x


@flow
def twice() -> list[int]:
    return [square(3), square(3)]


with ephemeral.temporary_server():
    results = twice()
    with get_client(sync_client=True) as client:
        block_types = len(client.read_block_types())
    settings = httpx.get(os.environ["PREFECT_API_URL"] + "/admin/settings").json()  # the server's own
print(results, len(calls), block_types, settings["server"]["services"]["triggers"]["enabled"])
"""


def test_the_temporary_server_registers_no_block_types_runs_no_triggers_and_task_results_still_cache(tmp_path):
    """The command's temporary server starts without Prefect's block auto-registration (which
    imported every Prefect collection, Dask's distributed among them, at each start): on a new
    database it holds no block types, and a task's persisted result is still found by its cache
    key (results are stored locally and need none). Its settings, as the server itself answers
    them, leave out the automations' triggers and actions services (Prefect starts a service
    only where its setting enables it)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    env["PREFECT_LOCAL_STORAGE_PATH"] = str(tmp_path / "results")
    done = subprocess.run(
        [sys.executable, "-c", BLOCKS_PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[9,", "9]", "1", "0", "False"], done.stdout


def test_a_block_registration_or_triggers_setting_of_the_user_is_left_as_set():
    from flows import ephemeral

    blocks_off = {
        "PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "false",
        "PREFECT_SERVER_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false",
    }
    triggers_off = {"PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false"}
    assert ephemeral._unused_work_off({"HOME": "/home/u"}) == {**blocks_off, **triggers_off}
    for name in ephemeral.BLOCK_REGISTRATION_SETTINGS:
        assert ephemeral._unused_work_off({name: "true"}) == triggers_off
    for name in ephemeral.TRIGGERS_SETTINGS:
        assert ephemeral._unused_work_off({name: "true"}) == blocks_off
