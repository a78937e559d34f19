"""The temporary Prefect server of a command-line run, tied to the command's life.

With no ``PREFECT_API_URL`` (no ``make serve``), Prefect starts a temporary API server as
a child process and stops it at exit. A command killed with SIGKILL (or by the OOM
killer) never reaches that exit hook, and the server (about 200 MB) stayed behind, one
per killed command. :func:`temporary_server` starts the same server (Prefect's own app
factory and settings, ``prefect.server.api.server.SubprocessASGIServer``'s command line)
through :func:`create_app` below, which first asks the kernel to send the server SIGTERM
when the command that started it dies (Linux ``prctl(PR_SET_PDEATHSIG)``), however it dies.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from ensemble_core import startup_gc
from ensemble_core.processutil import die_with_parent, free_port

PARENT_ENV = "ENSEMBLE_EPHEMERAL_PARENT_PID"  # flows/__init__.py reads it by name (the collector paused)
# The server imports Prefect's whole API and migrates its database before it answers:
# seconds on a quiet machine, over a minute on two cores shared with training runs.
# PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS raises it further.
MIN_STARTUP_TIMEOUT_S = 180.0


class ServerStartError(RuntimeError):
    """The temporary Prefect server did not start (its output is in the message)."""


def create_app():
    """uvicorn app factory of the temporary server: Prefect's app, tied to the parent
    (SIGTERM when it dies; where that is not available, Prefect's own exit hook applies)."""
    expected = os.environ.get(PARENT_ENV)
    die_with_parent(signal.SIGTERM, int(expected) if expected else None)
    from prefect.server.api.server import create_app as prefect_create_app

    app = prefect_create_app()
    startup_gc.resume()  # paused by flows/__init__.py (PARENT_ENV) since the server's first import
    prefect_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_):
        async with prefect_lifespan(app_) as state:
            first = asyncio.create_task(_first_request(app_))
            try:
                yield state
            finally:
                first.cancel()

    app.router.lifespan_context = lifespan
    return app


async def _first_request(app) -> None:
    """Answer one API request inside the server as soon as it has started, while the command
    is still importing and checking its input. FastAPI (0.150) builds its routes' request
    handling at the first request that is not ``/health``: 0.45-0.65 s of the server's CPU
    that the command's first API call (Prefect's API version check at the flow's start)
    otherwise waited for."""
    transport = httpx.ASGITransport(app=app)
    with contextlib.suppress(Exception):  # a warm-up: the command's own requests report errors
        async with httpx.AsyncClient(transport=transport, base_url="http://temporary-server") as client:
            await client.get("/api/admin/version")


#: The commands that run a flow (and so need a server); :func:`start_early` starts one for them.
FLOW_COMMANDS = ("flows.train_ensemble", "flows.predict", "flows.monitor")
_early: tuple[subprocess.Popen, int] | None = None  # (server, port) started by start_early
_early_answered = False  # the server start_early started has answered a health check once


def _server_command(port: int) -> list[str]:
    """Prefect's SubprocessASGIServer command line, with this module's app factory."""
    root = str(Path(__file__).resolve().parents[1])
    cmd = [sys.executable, "-m", "uvicorn", "--app-dir", root, "--factory", "flows.ephemeral:create_app"]
    return [*cmd, "--host", "127.0.0.1", "--port", str(port), "--log-level", "error", "--lifespan", "on"]


#: Prefect's block auto-registration settings (each under its current and its older name).
BLOCK_REGISTRATION_SETTINGS = (
    "PREFECT_SERVER_REGISTER_BLOCKS_ON_START",
    "PREFECT_API_BLOCKS_REGISTER_ON_START",
    "PREFECT_SERVER_MEMOIZE_BLOCK_AUTO_REGISTRATION",
    "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION",
)

#: Prefect's setting of its automations' triggers and actions services (current, older name).
TRIGGERS_SETTINGS = ("PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED", "PREFECT_API_SERVICES_TRIGGERS_ENABLED")


def _unused_work_off(env: dict[str, str]) -> dict[str, str]:
    """What the temporary server does at its start and that no run of it needs, switched off:
    each group of settings below is set to ``false`` under its current names, unless ``env``
    sets any name of that group (then the user's choice stands).

    - Block auto-registration (:data:`BLOCK_REGISTRATION_SETTINGS`): every start imported each
      installed Prefect collection (prefect-dask imports Dask's distributed) to hash the block
      registry against the last start's: 0.3-0.4 s of a 3.5 s start on 2 cores, on the
      command's critical path. The flows use no block types (task results persist to local
      storage, which needs none).
    - The automations' services (:data:`TRIGGERS_SETTINGS`: Prefect's ``ReactiveTriggers``
      and ``Actions``): at its start the actions service builds two in-process API clients,
      and each computes the hash of Prefect's whole settings (``create_app``'s cache key,
      Prefect 3.9.1): 0.3-1.0 s of the server's CPU, on its event loop while the command's
      first requests wait. The project's automations (:mod:`flows.automations`) live on the
      long-lived server ``make serve`` starts, which watches runs; a server that lives only
      as long as one command has nothing for them to act on.

    A server started by ``make serve`` or ``prefect server start`` keeps Prefect's defaults."""
    off: dict[str, str] = {}
    for names in (BLOCK_REGISTRATION_SETTINGS, TRIGGERS_SETTINGS):
        if not any(name in env for name in names):
            off.update(dict.fromkeys(names[::2], "false"))  # the current names
    return off


def _spawn(port: int, settings_env: dict[str, str]) -> subprocess.Popen:
    env = {
        **_unused_work_off({**os.environ, **settings_env}),
        **os.environ,
        **settings_env,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        PARENT_ENV: str(os.getpid()),
    }
    # Its own session: Ctrl-C in a terminal signals the whole foreground process group, and
    # a server that died of it left the command waiting on it after training had stopped
    # cleanly. It still dies with this process (die_with_parent).
    return subprocess.Popen(
        _server_command(port), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )


def start_early(argv: list[str]) -> bool:
    """Start the temporary server at the very start of ``python -m flows.<command>``
    (``argv``: ``sys.orig_argv``), so that it starts while the command imports its modules
    and checks its input (3-5 s each on 2 cores) instead of after; :func:`temporary_server`
    then waits for it. Only for :data:`FLOW_COMMANDS`, not for ``--help``, and not when
    ``PREFECT_API_URL`` is set in the environment (a configured server; one configured only
    in a Prefect profile is found later, and this server is then stopped unused). A command
    that is refused before its flow stops it at exit (and it dies with the command however
    the command ends: :func:`create_app`).

    Returns whether it started one. Raises nothing (a server that cannot start is reported
    by :func:`temporary_server`, as before)."""
    global _early, _early_answered
    if _early is not None or os.environ.get("PREFECT_API_URL"):
        return False
    try:
        module = argv[argv.index("-m") + 1]
    except (ValueError, IndexError):
        return False
    rest = argv[argv.index("-m") + 2 :]
    if module not in FLOW_COMMANDS or "-h" in rest or "--help" in rest:
        return False
    try:
        port = free_port()
        _early = (_spawn(port, {}), port)
        _early_answered = False
    except OSError:
        return False
    atexit.register(_stop_early)
    return True


def while_starting(work: Callable[[], object]) -> bool:
    """Call ``work`` now if the server :func:`start_early` started has not answered yet.

    Prefect's server takes 4-5 s to start on 2 cores (importing its API, migrating its
    database, building its routes), longer than the command's own imports and checks, so
    the command then waits for it in :func:`temporary_server`: work done meanwhile (``work``:
    imports the flow needs later) costs the command nothing. When the server already answers,
    or none was started early, ``work`` is left for later, where it would happen anyway.

    Once the server has answered, later calls do not ask it again: a server that has
    started but is slow to answer one health check (its event loop busy, or both cores
    busy) has still started, so ``work`` is left for later then too.

    Returns whether it called ``work``. Raises what ``work`` raises."""
    global _early_answered
    if _early is None or _early_answered:
        return False
    server, port = _early
    if server.poll() is not None:  # exited: temporary_server reports it
        return False
    if _answers(port, timeout=0.05):
        _early_answered = True
        return False
    work()
    return True


def _answers(port: int, timeout: float) -> bool:
    """Whether the server on ``port`` answers its health check within ``timeout`` seconds.

    Plain HTTP on the loopback interface, so no TLS context with certificates: httpx builds
    one for every client it creates, and loading a certificate bundle into it (certifi's, or
    SSL_CERT_FILE's) took 20 ms of this process's CPU per check (httpx 0.28), while the
    server's start competes for the same cores."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=timeout, verify=False).status_code == 200
    except httpx.HTTPError:
        return False


def _stop_early() -> None:
    global _early
    if _early is None:
        return
    server, _ = _early
    _early = None
    _stop(server)


def _stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _configured_api_url() -> str | None:
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


@contextlib.contextmanager
def temporary_server() -> Iterator[str | None]:
    """Run the body against a temporary Prefect server that dies with this process.

    Yields the API URL, or None (and starts nothing) when a server is configured
    (``PREFECT_API_URL`` in the environment, as ``source .serve/env`` sets after ``make serve``,
    or in the active profile). Inside the body, flow runs send no heartbeats
    (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` unset): nothing watches a temporary server's runs.

    Raises:
      ServerStartError: the server exited, or did not answer within
        ``max(MIN_STARTUP_TIMEOUT_S, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)``.
    """
    global _early
    if _configured_api_url():
        _stop_early()  # started for nothing: the profile names a server
        yield None
        return
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        get_current_settings,
        temporary_settings,
    )

    timeout = max(MIN_STARTUP_TIMEOUT_S, float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()))
    if _early is not None:  # started by start_early, with the same environment Prefect's settings come from
        server, port = _early
        _early = None
    else:
        port = free_port()
        server = _spawn(port, get_current_settings().to_environment_variables(exclude_unset=True))
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if server.poll() is not None:
                assert server.stderr is not None  # stderr=PIPE
                last = (server.stderr.read().decode(errors="replace").strip().splitlines() or ["no output"])[-1]
                raise ServerStartError(
                    f"Prefect's temporary server exited with code {server.returncode} ({last}); fix: check "
                    f"PREFECT_HOME's database, or start a server with `make serve` and set PREFECT_API_URL"
                )
            if _answers(port, timeout=2):
                break
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"Prefect's temporary server did not answer within {timeout:.0f} s; fix: retry on a less "
                    f"loaded machine, raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or start a server "
                    f"with `make serve` and set PREFECT_API_URL"
                )
            time.sleep(0.1)
        # No flow-run heartbeats on a server that lives only as long as the run: nothing
        # watches them (the zombie-run recovery, flows/reconcile.py, runs on a configured
        # server), and Prefect's heartbeat thread, which sleeps in whole seconds, held every
        # command up to a second at the flow's end waiting for it to stop (Prefect 3.9.1,
        # prefect/flow_engine.py _send_heartbeats: time.sleep(1) steps, joined on exit).
        with temporary_settings(updates={PREFECT_API_URL: url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            os.environ["PREFECT_API_URL"] = url  # for child processes and late settings reads
            try:
                yield url
            finally:
                os.environ.pop("PREFECT_API_URL", None)
    finally:
        from flows.prefect_services import DRAIN_TIMEOUT_S, drain_services

        drain_services(DRAIN_TIMEOUT_S)  # what the run still has to send goes to this server first
        _stop(server)
