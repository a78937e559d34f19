"""Is the Prefect server the commands will talk to answering (or, with none configured,
can the temporary one keep its database)? One line if not.

python -m flows.server_check   # exit 0 if it answers (or a temporary one can start), else 2 and one line
"""

from __future__ import annotations

import errno
import sys
import tempfile
from pathlib import Path

HEALTH_TIMEOUT_S = 5.0


def unreachable() -> str | None:
    """``None`` if the server at ``PREFECT_API_URL`` answers ``/health`` and accepts this
    client's ``PREFECT_API_AUTH_STRING``, or, with no server configured, the temporary
    server the command starts (:mod:`flows.ephemeral`) can write its database
    (:func:`temporary_database_unwritable`); else the one-line error message."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        return temporary_database_unwritable()
    try:
        httpx.get(url.rstrip("/") + "/health", timeout=HEALTH_TIMEOUT_S).raise_for_status()
    except httpx.HTTPError as err:
        reason = type(err).__name__ if not str(err) else str(err).splitlines()[0]
        return (
            f"the Prefect server at {url} does not answer ({reason}); fix: start it with `make serve`, "
            f"or unset PREFECT_API_URL (`prefect config unset PREFECT_API_URL`) to run without a server"
        )
    return _refuses_this_client(url)


def temporary_database_unwritable() -> str | None:
    """The one-line error when the temporary server's SQLite database (Prefect's setting
    ``PREFECT_SERVER_DATABASE_CONNECTION_URL``, by default ``prefect.db`` in
    ``PREFECT_HOME``, itself ``~/.prefect``) cannot be created or written: a read-only
    home directory, a full or read-only file system, a file where the directory should be.
    The server would fail at startup (after the data was prepared) with nothing but a
    database error. ``None`` for another database (PostgreSQL: the server checks it).

    Creates the database's directory when it is missing, as the server would."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    secret = settings.server.database.connection_url
    if secret is None:  # not configured: Prefect's default, prefect.db in PREFECT_HOME
        path = (settings.home / "prefect.db").expanduser()
    else:
        # SQLAlchemy's own parser (its import, 0.1 s, only when a database is configured)
        from sqlalchemy.engine import make_url

        url = make_url(secret.get_secret_value())
        if not url.drivername.startswith("sqlite") or not url.database or url.database == ":memory:":
            return None
        path = Path(url.database).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
        if path.exists():
            with path.open("r+b"):
                pass
    except OSError as err:
        where = path.parent
        while not where.exists() and where != where.parent:  # the directory that refused
            where = where.parent
        state = "read-only" if err.errno == errno.EROFS else "not writable"
        return (
            f"the temporary Prefect server cannot write its database {path}: {where} is {state} "
            f"({err.strerror or type(err).__name__}; PREFECT_HOME is {settings.home}); fix: set PREFECT_HOME to a "
            f"writable directory (export PREFECT_HOME=/tmp/prefect), or start a server with `make serve` and set "
            f"PREFECT_API_URL"
        )
    return None


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
    from ensemble_core import startup_gc

    startup_gc.resume()  # paused by flows/__init__.py while this module imported
    message = unreachable()
    if message:
        print(f"error: {message}", file=sys.stderr)
    sys.exit(2 if message else 0)
