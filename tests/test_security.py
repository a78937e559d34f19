"""Once the stack leaves loopback: the Prefect server behind its own authentication, the
run's Dask cluster behind TLS with mutual authentication."""

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ensemble_core.processutil import free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_prefect_server_with_an_auth_string_refuses_requests_without_credentials(tmp_path):
    """Prefect 3's ``PREFECT_SERVER_API_AUTH_STRING`` (HTTP basic auth), as docs/distributed.md
    (security once the stack leaves loopback) sets it: no or wrong credentials get 401, the client
    setting ``PREFECT_API_AUTH_STRING`` gets through; the health probe stays open."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(tmp_path / "home"),
        PREFECT_SERVER_API_AUTH_STRING="ensemble:s3cret",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}",
    )
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read()[-2000:]
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.5)
        assert httpx.post(f"{base}/flows/filter", json={}).status_code == 401
        assert httpx.post(f"{base}/flows/filter", json={}, auth=("ensemble", "wrong")).status_code == 401
        assert httpx.post(f"{base}/flows/filter", json={}, auth=("ensemble", "s3cret")).status_code == 200
        # The Prefect client of the project's commands, given the credentials, is let in.
        client_env = {**env, "PREFECT_API_URL": base, "PREFECT_API_AUTH_STRING": "ensemble:s3cret"}
        probe = "from prefect.client.orchestration import get_client\nwith get_client(sync_client=True) as c:\n"
        probe += "    print(len(c.read_flows()))"
        ok = subprocess.run([sys.executable, "-c", probe], env=client_env, capture_output=True, text=True, timeout=120)
        assert ok.returncode == 0 and ok.stdout.strip() == "0", ok.stderr[-2000:]
        client_env.pop("PREFECT_API_AUTH_STRING")
        refused = subprocess.run(
            [sys.executable, "-c", probe], env=client_env, capture_output=True, text=True, timeout=120
        )
        assert refused.returncode != 0 and "401" in refused.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_runs_dask_cluster_refuses_clients_without_its_certificates():
    """The local cluster a run starts (:func:`tasks.runners.local_cluster_kwargs`) listens
    on loopback over TLS only: a plain TCP client and a TLS client whose certificate the
    cluster's CA did not sign are refused; a client with them is served."""
    from distributed import Client, LocalCluster
    from distributed.security import Security

    from tasks.runners import local_cluster_kwargs

    kwargs = {**local_cluster_kwargs(1), "processes": False}  # a thread worker: same scheduler, faster
    with LocalCluster(**kwargs) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tls://127.0.0.1:")
        with pytest.raises(Exception):  # noqa: B017  (the comm layer's error type varies)
            Client(address.replace("tls://", "tcp://"), timeout="3s")
        stranger = Security.temporary()  # valid TLS certificates, but not signed by the cluster's CA
        with pytest.raises(OSError, match=r"Timed out|certificate|SSL|closed"):
            Client(address, security=stranger, timeout="3s")
        with Client(cluster) as client:
            assert client.submit(lambda x: x + 1, 1).result(timeout=30) == 2


def test_a_tls_listener_that_never_answers_the_dask_handshake_is_a_one_line_refusal(tmp_path, monkeypatch):
    """A listener that completes TLS with the client's certificates and then says nothing
    (not a Dask scheduler, or a stuck one): the pre-flight check gives up after twice
    its handshake timeout with a ConfigError, instead of hanging the run (Dask's connect
    bounds only reaching the listener)."""
    import socket
    import ssl
    import threading

    from ensemble_core.config import load_config
    from ensemble_core.errors import ConfigError
    from tasks import cluster
    from tests.tlscerts import CertificateAuthority

    ca = CertificateAuthority(tmp_path / "pki")
    cert, key = ca.issue("server", ["127.0.0.1"])
    client_cert, client_key = ca.issue("client", ["127.0.0.1"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca.ca_file))
    context.load_cert_chain(str(cert), str(key))
    context.verify_mode = ssl.CERT_REQUIRED
    listener = socket.create_server(("127.0.0.1", free_port()))
    held = []  # the silent listener keeps its connections open

    def serve():
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                with contextlib.suppress(OSError):
                    held.append(context.wrap_socket(conn, server_side=True))

    threading.Thread(target=serve, daemon=True).start()
    port = listener.getsockname()[1]
    sets = [
        "distributed.member_groups=2",
        "distributed.task_runner=dask",
        f"distributed.address=tls://127.0.0.1:{port}",
        f"distributed.tls_ca_file={ca.ca_file}",
        f"distributed.tls_cert={client_cert}",
        f"distributed.tls_key={client_key}",
    ]
    config = load_config(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml", sets)
    monkeypatch.setattr(cluster, "HANDSHAKE_TIMEOUT_S", 1.0)
    started = time.monotonic()
    try:
        with pytest.raises(ConfigError, match=r"answered the Dask handshake within 2 s.*fix:"):
            cluster.check_cluster(config)
    finally:
        listener.close()
        for conn in held:
            conn.close()
    assert time.monotonic() - started < 15
    assert held  # the TLS handshake itself succeeded: the silence came after it
