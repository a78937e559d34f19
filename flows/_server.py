"""Is the Prefect server the commands will talk to answering? One line if not.

python -m flows._server   # exit 0 if it answers (or none is configured), else 2 and one line
"""

from __future__ import annotations

import sys

HEALTH_TIMEOUT_S = 5.0


def unreachable() -> str | None:
    """``None`` if no server is configured (Prefect then starts a temporary one) or the
    server at ``PREFECT_API_URL`` answers ``/health``; else the one-line error message."""
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
    return None


if __name__ == "__main__":
    message = unreachable()
    if message:
        print(f"error: {message}", file=sys.stderr)
    sys.exit(2 if message else 0)
