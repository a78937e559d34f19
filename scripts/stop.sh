#!/usr/bin/env bash
# Stop what scripts/serve.sh started: the worker, then the server (whole process groups).
set -uo pipefail
cd "$(dirname "$0")/.."
STATE=${ENSEMBLE_SERVE_DIR:-.serve}
for name in worker server; do
  file="$STATE/$name.pid"
  [ -f "$file" ] || continue
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL -- "-$pid" 2>/dev/null
    echo "stopped $name (pid $pid)"
  fi
  rm -f "$file"
done
