#!/usr/bin/env bash
# `prefect deployment run`, but one line instead of a traceback when the server is down:
#   scripts/deployment-run.sh 'train-ensemble/adhoc' -p config='{"ensemble": {"size": 4}}' --watch
# Every argument is passed on to `prefect deployment run`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${ENSEMBLE_VENV:-.venv}/bin
"$BIN/python" -m flows._server
exec "$BIN/prefect" deployment run "$@"
