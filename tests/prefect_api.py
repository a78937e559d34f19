"""One Prefect API server per test session, for the command lines the tests start.

A command line started without ``PREFECT_API_URL`` starts a temporary Prefect server of
its own (``flows/ephemeral.py``): about 5 s of CPU per command on 2 cores, most of a tiny
run's cost. The tests that start command lines in subprocesses give them the URL of one
server instead, through :func:`cli_env`: under pytest-xdist the controlling process starts
it for every worker (:data:`SHARED_API_ENV`), else the test process starts its own; the tests
of the temporary server itself (``tests/test_cli_process.py``, ``tests/stop_proc.py``)
keep starting their own.

The server is Prefect's own app (``prefect.server.api.server:create_app``) under uvicorn,
on a free port of 127.0.0.1, with its SQLite database under its own ``PREFECT_HOME``, and
without the UI.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from ensemble_core.processutil import free_port

STARTUP_TIMEOUT_S = 180  # imports and migrations; over a minute on 2 busy cores


#: The URL of the Prefect API server pytest's controlling process started for every
#: pytest-xdist worker (``tests/conftest.py``): one server for the session instead of one
#: per worker (each costs about 10 s of CPU to start and 1.5% of a core while idle).
SHARED_API_ENV = "ENSEMBLE_TESTS_PREFECT_API"


def start_server(home: Path) -> tuple[subprocess.Popen, str]:
    """Start a Prefect API server with its database under ``home`` (not waiting for it);
    returns the process and its API URL."""
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        "PREFECT_HOME": str(home),
        "PREFECT_UI_ENABLED": "0",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # The services of Prefect's temporary server only (what a command line's own server
        # runs, flows/ephemeral.py): the full set polls the database all session long.
        "PREFECT__SERVER_EPHEMERAL": "1",
        # As the temporary server (flows/ephemeral.py): no block auto-registration, no
        # automations' triggers and actions.
        "PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "false",
        "PREFECT_SERVER_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false",
        "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
    }
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "error"]
    home.mkdir(parents=True, exist_ok=True)
    with (home / "server.log").open("wb") as out:
        server = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    return server, f"http://127.0.0.1:{port}/api"


def wait_healthy(url: str, server: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Wait until the server at ``url`` answers its health check.

    Raises:
      RuntimeError: ``server`` exited, or no answer within STARTUP_TIMEOUT_S (its log).
    """
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if server is not None and server.poll() is not None:
            tail = log.read_text()[-2000:] if log is not None else ""
            raise RuntimeError(f"the Prefect server exited with {server.returncode}: {tail}")
        try:
            # verify=False: plain HTTP on loopback, and httpx loads a certificate bundle (20 ms of CPU) for
            # every client otherwise, five times a second while the server starts
            if httpx.get(f"{url}/health", timeout=2, verify=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Prefect server at {url} did not answer within {STARTUP_TIMEOUT_S} s")
        time.sleep(0.2)


def stop_server(server: subprocess.Popen) -> None:
    """Terminate ``server`` (kill it after 30 s)."""
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


@contextmanager
def api_server(home: Path) -> Iterator[str]:
    """A Prefect API server with its database under ``home``; yields its API URL and stops
    it at exit.

    Raises:
      RuntimeError: it exited, or did not answer within STARTUP_TIMEOUT_S (its output).
    """
    server, url = start_server(home)
    try:
        wait_healthy(url, server, home / "server.log")
        yield url
    finally:
        stop_server(server)


def cli_env(api_url: str, **extra: str) -> dict[str, str]:
    """The environment of a command line on the shared server: this process's, without its
    Prefect API settings and its simulated-device flag (the command sets its own), with
    ``PREFECT_API_URL=api_url`` and ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "XLA_FLAGS"}
    return {**env, "PREFECT_API_URL": api_url, **extra}


@contextmanager
def this_process_on(api_url: str) -> Iterator[None]:
    """This process's flows and Prefect clients on the server at ``api_url`` (the session's
    shared server, ``prefect_api``), as ``prefect.testing.utilities.prefect_test_harness``
    points them at a server of its own (about 10 s of CPU to start one): Prefect's settings
    for the body, its log and event workers drained at exit, so nothing of the body is sent
    after it. The server holds other tests' runs: read back only your own
    (:func:`own_runs`)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        try:
            yield
        finally:
            with contextlib.suppress(RuntimeError):  # the log worker may not have started
                APILogWorker.instance().drain()
            EventsWorker.drain_all()


def new_tag() -> str:
    """A tag no other test's runs carry, for :func:`own_runs`."""
    import uuid

    return f"test-{uuid.uuid4().hex[:12]}"


@contextmanager
def own_runs(tag: str | None = None) -> Iterator[str]:
    """``tag`` (a :func:`new_tag` by default) on every flow run and task run the body starts
    in this process (``prefect.tags``), to read back only those from a shared server:
    yields the tag, for :func:`own_flow_run_filter`."""
    from prefect import tags

    tag = tag or new_tag()
    with tags(tag):
        yield tag


def own_flow_run_filter(tag: str):
    """A ``FlowRunFilter`` of the flow runs (subflows included) started under ``own_runs``'s
    ``tag``: pass it as ``flow_run_filter`` to ``read_task_runs``, ``read_artifacts`` or
    ``read_flow_runs``."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    return FlowRunFilter(tags=FlowRunFilterTags(all_=[tag]))
