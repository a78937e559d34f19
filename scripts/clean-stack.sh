#!/usr/bin/env bash
# `make clean-stack`: remove what the stopped stack of scripts/serve.sh keeps between
# restarts: the Prefect server's database (its PostgreSQL data directory: .serve/postgres,
# or where .serve/postgres.dir says, e.g. /var/lib/ensemble-pipeline/postgres-N as root)
# with every flow run's history, and its logs and pid files in .serve/. The runs' own
# directories (runs/) and your Prefect profile are left alone. Refuses while any part of the
# stack runs: make stop first.
#
# Environment: ENSEMBLE_SERVE_DIR (.serve), ENSEMBLE_VENV (.venv), as scripts/serve.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${ENSEMBLE_SERVE_DIR:-.serve}
[ -d "$STATE" ] || { echo "nothing to remove: $STATE does not exist"; exit 0; }

running=""
for name in server worker reconciler; do
  if [ -f "$STATE/$name.pid" ] && kill -0 "$(cat "$STATE/$name.pid")" 2>/dev/null; then
    running="$running $name (pid $(cat "$STATE/$name.pid"))"
  fi
done
if [ -n "$running" ]; then
  echo "error: the stack is running:$running; fix: make stop, then make clean-stack" >&2
  exit 2
fi
# The database: the directory the last start used, and the default ones of this serve
# directory (scripts/postgres.sh refuses, exit 2, while a cluster runs in one).
if [ -f "$STATE/postgres.dir" ]; then
  ENSEMBLE_PGDATA=$(cat "$STATE/postgres.dir") scripts/postgres.sh remove
fi
env -u ENSEMBLE_PGDATA scripts/postgres.sh remove
# Then the files scripts/serve.sh writes there (by name: the directory may be one of yours).
rm -f "$STATE"/{server,worker,reconciler}.pid "$STATE"/{server,worker,reconciler,postgres}.log "$STATE/env" "$STATE/postgres.dir"
if rmdir "$STATE" 2>/dev/null; then
  echo "removed $STATE (the stack's logs)"
else
  echo "removed the stack's logs from $STATE (other files in it are left alone)"
fi
