#!/usr/bin/env bash
# Stop what scripts/serve.sh started: the worker's flow runs, the worker, the reconciler,
# the server, then its PostgreSQL cluster; and remove .serve/env, so that scripts/deployment-run.sh
# no longer finds the stack. The user's Prefect profile is not touched (one note line where
# it still points at 127.0.0.1, as earlier versions of scripts/serve.sh left it). The data
# stays for the next start: `make clean-stack` removes it.
#
# A flow run in progress gets SIGTERM first (its process is in a session of its own, so
# stopping the worker's process group would leave it orphaned): training saves a
# checkpoint at the next step and the run ends Crashed while the server still listens;
# the retry-crashed-runs automation reschedules it and the next `make serve` resumes it.
set -uo pipefail
cd "$(dirname "$0")/.."
STATE=${ENSEMBLE_SERVE_DIR:-.serve}
BIN=${ENSEMBLE_VENV:-.venv}/bin
FLOW_RUN_GRACE_S=${ENSEMBLE_STOP_GRACE_S:-120}

runs=""
if [ -f "$STATE/worker.pid" ] && kill -0 "$(cat "$STATE/worker.pid")" 2>/dev/null; then
  runs=$(pgrep -P "$(cat "$STATE/worker.pid")" -f "prefect.engine|_workspace_supervisor|prefect.runner" || true)
fi

stop_group() {  # stop_group NAME: SIGTERM the process group saved in $STATE/NAME.pid, SIGKILL after 30 s
  local file="$STATE/$1.pid"
  [ -f "$file" ] || return 0
  local pid
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL -- "-$pid" 2>/dev/null
    echo "stopped $1 (pid $pid)"
  fi
  rm -f "$file"
}

# The worker first, so that it starts nothing new (the retry automation reschedules a run
# that ends Crashed at once); then its flow runs, while the server still records them.
stop_group worker
if [ -n "$runs" ]; then
  echo "stopping flow-run processes $(echo $runs) (SIGTERM: checkpoint, then Crashed and rescheduled)"
  kill -TERM $runs 2>/dev/null
  for _ in $(seq 1 "$FLOW_RUN_GRACE_S"); do
    alive=""; for p in $runs; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
    [ -z "$alive" ] && break
    sleep 1
  done
  for p in $runs; do kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null; done
fi
stop_group reconciler
stop_group server
# The database last (scripts/postgres.sh: the cluster this stack started, if any).
rc=0
if [ -f "$STATE/postgres.dir" ]; then
  ENSEMBLE_PGDATA=$(cat "$STATE/postgres.dir") scripts/postgres.sh stop || rc=$?
fi
# The stack's URL, as `source .serve/env` set it in the shell that runs this (if it did).
stack_url=""
[ -f "$STATE/env" ] && stack_url=$(sed -n 's/^export PREFECT_API_URL=//p' "$STATE/env")
rm -f "$STATE/env"
if [ -n "$stack_url" ] && [ "${PREFECT_API_URL:-}" = "$stack_url" ]; then
  echo "note: this shell still has PREFECT_API_URL=$stack_url (from source $STATE/env); run: unset PREFECT_API_URL"
fi
# One note line where the user's Prefect profile still points at a server on 127.0.0.1, as
# earlier versions of scripts/serve.sh left it (scripts/serve.sh prints the same); Python
# (a second) only where the profiles file may hold such a URL.
home=${PREFECT_HOME:-$HOME/.prefect}
if [ -n "${PREFECT_PROFILES_PATH:-}" ] || [ -f .env ] || [ -f prefect.toml ] ||
   grep -qs '127\.0\.0\.1' "${home/#\~/$HOME}/profiles.toml"; then
  env -u PREFECT_API_URL "$BIN/python" - <<'PY' 2>/dev/null
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
fi
exit $rc
