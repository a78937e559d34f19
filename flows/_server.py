"""Is the Prefect server the commands will talk to answering? One line if not.

python -m flows._server   # exit 0 if it answers (or none is configured), else 2 and one line
"""

from __future__ import annotations

import sys

HEALTH_TIMEOUT_S = 5.0


def unreachable() -> str | None:
    """``None`` if no server is configured (Prefect then starts a temporary one) or the
    server at ``PREFECT_API_URL`` answers ``/health`` and accepts this client's
    ``PREFECT_API_AUTH_STRING``; else the one-line error message."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        return None
    try:
        httpx.get(url.rstrip("/") + "/health", timeout=HEALTH_TIMEOUT_S).raise_for_status()
    except httpx.HTTPError as err:
        reason = type(err).__name__ if not str(err) else str(err).splitlines()[0]
        return (
            f"the Prefect server at {url} does not answer ({reason}); fix: start it with `make serve`, "
            f"or unset PREFECT_API_URL (`prefect config unset PREFECT_API_URL`) to run without a server"
        )
    return _refuses_this_client(url)


def _refuses_this_client(url: str) -> str | None:
    """The one-line error when the server answers but refuses this client's credentials
    (``PREFECT_API_AUTH_STRING``, HTTP 401; ``/health`` needs none, the API does)."""
    import base64

    import httpx
    from prefect.settings import PREFECT_API_AUTH_STRING

    auth = PREFECT_API_AUTH_STRING.value()
    headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
    try:
        status = httpx.get(url.rstrip("/") + "/admin/version", headers=headers, timeout=HEALTH_TIMEOUT_S).status_code
    except httpx.HTTPError:
        return None  # it answered /health: leave the rest to the client
    if status != 401:
        return None
    given = "a wrong PREFECT_API_AUTH_STRING" if auth else "no PREFECT_API_AUTH_STRING"
    return (
        f"the Prefect server at {url} refuses this client (HTTP 401: {given}); fix: set PREFECT_API_AUTH_STRING "
        f"to the server's PREFECT_SERVER_API_AUTH_STRING (`prefect config set PREFECT_API_AUTH_STRING=user:password`)"
    )


if __name__ == "__main__":
    message = unreachable()
    if message:
        print(f"error: {message}", file=sys.stderr)
    sys.exit(2 if message else 0)
