#!/usr/bin/env bash
# The Prefect server's database: a private PostgreSQL cluster of this stack's own.
#
#   scripts/postgres.sh start   init (first time), start, create database "prefect";
#                               prints the connection URL for PREFECT_API_DATABASE_CONNECTION_URL
#   scripts/postgres.sh stop    fast shutdown (committed data stays)
#   scripts/postgres.sh found   exit 0 when PostgreSQL's server programs are installed
#
# Why not Prefect's default SQLite: under CPU contention (a training run holding the cores)
# SQLite answers concurrent writers with "database is locked", and the server then drops
# events, among them the heartbeats and state changes its automations act on (a crashed run
# not rescheduled, a live run marked crashed). Prefect recommends PostgreSQL for this.
#
# The cluster listens on a unix socket in its data directory only (no TCP port), with
# trust authentication: only its owner (and root) can open the socket (mode 0700).
# PostgreSQL refuses to run as root; as root the cluster runs as the "postgres" user.
#
# Environment: ENSEMBLE_SERVE_DIR (.serve), ENSEMBLE_PGDATA (the data directory;
# $ENSEMBLE_SERVE_DIR/postgres, or under /var/lib/ensemble-pipeline when run as root).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=$(mkdir -p "${ENSEMBLE_SERVE_DIR:-.serve}" && cd "${ENSEMBLE_SERVE_DIR:-.serve}" && pwd)

bindir() {  # the directory with all of PostgreSQL's server programs this script runs
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) "$(dirname "$(command -v pg_ctl 2>/dev/null || echo /nonexistent/x)")"; do
    [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ] && [ -x "$d/psql" ] && [ -x "$d/createdb" ] && { echo "$d"; return; }
  done
  return 1
}

if [ "$(id -u)" = 0 ]; then
  AS=(runuser -u postgres --)
  PGUSER=postgres
  DEFAULT_PGDATA=/var/lib/ensemble-pipeline/postgres-$(printf %s "$STATE" | cksum | cut -d' ' -f1)
else
  AS=()
  PGUSER=$(id -un)
  DEFAULT_PGDATA=$STATE/postgres
fi
PGDATA=${ENSEMBLE_PGDATA:-$DEFAULT_PGDATA}

case "${1:-}" in
  found)
    bindir >/dev/null ;;
  start)
    BIN=$(bindir) || {
      echo "error: PostgreSQL's server programs (initdb, pg_ctl) are not installed; fix: apt-get install postgresql (or set ENSEMBLE_DB=sqlite)" >&2
      exit 2
    }
    if [ "${#PGDATA}" -gt 90 ]; then
      echo "error: the PostgreSQL data directory path is ${#PGDATA} characters, too long for its unix socket; fix: set ENSEMBLE_PGDATA to a shorter path" >&2
      exit 2
    fi
    if [ ! -f "$PGDATA/PG_VERSION" ]; then
      mkdir -p "$PGDATA"
      chmod 700 "$PGDATA"
      [ "$(id -u)" = 0 ] && chown postgres: "$PGDATA"
      "${AS[@]}" "$BIN/initdb" -D "$PGDATA" -U "$PGUSER" --auth=trust -E UTF8 >>"$STATE/postgres.log" 2>&1 || {
        echo "error: initdb failed for $PGDATA; see $STATE/postgres.log" >&2; exit 1; }
    fi
    if ! "${AS[@]}" "$BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
      echo "==== $(date -u +%Y-%m-%dT%H:%M:%SZ) postgres started by scripts/postgres.sh ====" >>"$STATE/postgres.log"
      # pg_ctl's log file must be writable by the cluster's user: it is $PGDATA/server.log.
      "${AS[@]}" "$BIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/server.log" -w -t 120 \
        -o "-c listen_addresses='' -c unix_socket_directories='$PGDATA' -c unix_socket_permissions=0700 -c max_connections=200" \
        start >/dev/null || { echo "error: PostgreSQL did not start; see $PGDATA/server.log" >&2; exit 1; }
    fi
    "${AS[@]}" "$BIN/psql" -h "$PGDATA" -U "$PGUSER" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='prefect'" | grep -q 1 ||
      "${AS[@]}" "$BIN/createdb" -h "$PGDATA" -U "$PGUSER" prefect
    echo "$PGDATA" >"$STATE/postgres.dir"
    echo "postgresql+asyncpg://$PGUSER@/prefect?host=$PGDATA" ;;
  stop)
    [ -f "$PGDATA/PG_VERSION" ] || exit 0
    BIN=$(bindir) || exit 0
    if "${AS[@]}" "$BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
      "${AS[@]}" "$BIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null && echo "stopped postgres ($PGDATA)"
    fi ;;
  *)
    echo "usage: scripts/postgres.sh start|stop|found" >&2; exit 2 ;;
esac
