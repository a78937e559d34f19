"""Before any compute: can this client really work with the cluster the config names?

:func:`ensemble_core.runs.preflight` checks that something answers at
``distributed.address`` (ensemble_core imports no Dask); here the Dask handshake itself is
made, with the user's certificates, so that a wrong CA, an expired or mismatched
certificate, or a plain ``tcp://`` address of a TLS-only scheduler is one line before
anything is trained, instead of a traceback from inside the flow run.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import ssl
from pathlib import Path

from ensemble_core import runs
from ensemble_core.config import PipelineConfig
from ensemble_core.data import DatasetInfo
from ensemble_core.errors import ConfigError

HANDSHAKE_TIMEOUT_S = 10.0
_FIX_TLS = "fix: give the cluster's CA certificate (distributed.tls_ca_file) and a client certificate and key it signed"


def client_security(config: PipelineConfig):
    """The client's ``distributed.security.Security`` for a tls:// address (None for tcp://).

    Raises:
      ConfigError: the certificate has expired, or the files cannot be loaded together
        (not PEM, a key that is not the certificate's).
    """
    from cryptography import x509
    from distributed.security import Security

    dist = config.distributed
    if not (dist.address or "").startswith("tls://"):
        return None
    try:
        cert = x509.load_pem_x509_certificate(Path(str(dist.tls_cert)).read_bytes())
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"distributed.tls_cert={dist.tls_cert} is not a readable PEM certificate ({err}); {_FIX_TLS}"
        ) from None
    now = dt.datetime.now(dt.UTC)
    if cert.not_valid_after_utc < now or cert.not_valid_before_utc > now:
        raise ConfigError(
            f"the certificate distributed.tls_cert={dist.tls_cert} is valid from {cert.not_valid_before_utc:%Y-%m-%d} "
            f"to {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, not now",
            fix="have the cluster's CA issue a new one",
        )
    files = {"tls_ca_file": dist.tls_ca_file, "tls_client_cert": dist.tls_cert, "tls_client_key": dist.tls_key}
    security = Security(**files, require_encryption=True)
    try:
        security.get_connection_args("client")
    except (ssl.SSLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or str(err)
        raise ConfigError(
            f"distributed.tls_key={dist.tls_key} does not load with distributed.tls_cert={dist.tls_cert} and "
            f"distributed.tls_ca_file={dist.tls_ca_file} ({reason})",
            fix="give the key of that certificate",
        ) from None
    return security


def check_cluster(config: PipelineConfig) -> None:
    """With ``distributed.task_runner=dask`` and an ``address``: a Dask handshake with the
    scheduler there, with the configured certificates (``tls://``), within
    :data:`HANDSHAKE_TIMEOUT_S`.

    Raises:
      ConfigError: one line naming the problem and the fix (see the module's docstring).
    """
    dist = config.distributed
    if dist.task_runner != "dask" or dist.address is None:
        return
    from distributed.comm import connect

    security = client_security(config)
    args = {} if security is None else security.get_connection_args("client")

    async def handshake() -> None:
        comm = await connect(dist.address, timeout=HANDSHAKE_TIMEOUT_S, **args)
        await comm.close()

    try:
        # connect()'s timeout bounds reaching the listener, not Dask's handshake after it
        # (by design, dask/distributed#7698): a listener that takes the TLS connection and
        # never answers (not a Dask scheduler, or a stuck one) would hang the run here.
        asyncio.run(asyncio.wait_for(handshake(), 2 * HANDSHAKE_TIMEOUT_S))
    except TimeoutError:
        raise ConfigError(
            f"nothing at distributed.address={dist.address} answered the Dask handshake within "
            f"{2 * HANDSHAKE_TIMEOUT_S:.0f} s: it is not a Dask scheduler, or one too busy or stuck to answer",
            fix="give the address of a running Dask scheduler, or restart it",
        ) from None
    except Exception as err:  # noqa: BLE001  (distributed's comm errors vary by failure)
        reason = str(err).splitlines()[-1][-200:] if str(err) else type(err).__name__
        if security is None:
            raise ConfigError(
                f"the Dask scheduler at distributed.address={dist.address} ended the handshake ({reason}): it may "
                "accept TLS only",
                fix="use its tls:// address with distributed.tls_ca_file, tls_cert and tls_key",
            ) from None
        raise ConfigError(
            f"the TLS handshake with the Dask scheduler at {dist.address} failed ({reason}): its certificate is not "
            f"signed by distributed.tls_ca_file={dist.tls_ca_file}, or it does not accept this client's "
            f"certificate; {_FIX_TLS}"
        ) from None


# Preflights a command line passed in this process for the one flow run it starts next:
# {the run's identity: the dataset}. The flow's preflight takes its entry (once) instead of
# checking again, so a run is preflighted once whichever way it starts.
_PASSED_FOR_NEXT_RUN: dict[str, DatasetInfo] = {}


def _identity(config: PipelineConfig, output_dir: str, run_name: str) -> str:
    return json.dumps([config.model_dump(mode="json"), str(output_dir), run_name], sort_keys=True)


def preflight(config: PipelineConfig, output_dir: str, run_name: str) -> DatasetInfo:
    """The flow's preflight: :func:`ensemble_core.runs.preflight`, then
    :func:`check_cluster`; skipped once when :func:`preflight_before_flow` passed for the
    same config, output directory and run name in this process just before."""
    passed = _PASSED_FOR_NEXT_RUN.pop(_identity(config, output_dir, run_name), None)
    _PASSED_FOR_NEXT_RUN.clear()  # for the next flow run only, whichever it is
    if passed is not None:
        return passed
    dataset = runs.preflight(config, output_dir, run_name)
    check_cluster(config)
    return dataset


def preflight_before_flow(config: PipelineConfig, output_dir: str, run_name: str) -> DatasetInfo:
    """A command line's preflight before it starts the flow run (a refusal is one line and
    exit code 2, with no flow run): :func:`preflight`, remembered for that flow run's own
    preflight, which then does not check again."""
    _PASSED_FOR_NEXT_RUN.clear()
    dataset = preflight(config, output_dir, run_name)
    _PASSED_FOR_NEXT_RUN[_identity(config, output_dir, run_name)] = dataset
    return dataset
