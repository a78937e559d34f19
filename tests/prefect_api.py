"""One Prefect API server per test process, for the command lines the tests start.

A command line started without ``PREFECT_API_URL`` starts a temporary Prefect server of
its own (``flows/_ephemeral.py``): about 5 s of CPU per command on 2 cores, most of a tiny
run's cost. The tests that start command lines in subprocesses give them the URL of one
server per test process (pytest-xdist worker) instead, through :func:`cli_env`; the tests
of the temporary server itself (``tests/test_cli_process.py``, ``tests/stop_proc.py``)
keep starting their own.

The server is Prefect's own app (``prefect.server.api.server:create_app``) under uvicorn,
on a free port of 127.0.0.1, with its SQLite database under its own ``PREFECT_HOME``, and
without the UI.
"""

from __future__ import annotations

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


@contextmanager
def api_server(home: Path) -> Iterator[str]:
    """A Prefect API server with its database under ``home``; yields its API URL and stops
    it at exit.

    Raises:
      RuntimeError: it exited, or did not answer within STARTUP_TIMEOUT_S (its output).
    """
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")},
        "PREFECT_HOME": str(home),
        "PREFECT_UI_ENABLED": "0",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # The services of Prefect's temporary server only (what a command line's own server
        # runs, flows/_ephemeral.py): the full set polls the database all session long.
        "PREFECT__SERVER_EPHEMERAL": "1",
    }
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "error"]
    log = home / "server.log"
    home.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        server = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the Prefect server exited with {server.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Prefect server did not answer within {STARTUP_TIMEOUT_S} s")
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def cli_env(api_url: str, **extra: str) -> dict[str, str]:
    """The environment of a command line on the shared server: this process's, without its
    Prefect API settings and its simulated-device flag (the command sets its own), with
    ``PREFECT_API_URL=api_url`` and ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "XLA_FLAGS"}
    return {**env, "PREFECT_API_URL": api_url, **extra}
