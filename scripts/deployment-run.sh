#!/usr/bin/env bash
# `prefect deployment run` on the stack of `make serve`, but one line instead of a traceback
# when there is no server to run it on:
#   scripts/deployment-run.sh 'train-ensemble/adhoc' -p config='{"ensemble": {"size": 4}}' --watch
# Every argument is passed on to `prefect deployment run`.
#
# The server: PREFECT_API_URL of the environment; else that of .serve/env, which
# scripts/serve.sh writes while the stack runs (ENSEMBLE_SERVE_DIR: .serve); else that of
# your Prefect profile. With none of them it refuses (a temporary server has no deployments).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${ENSEMBLE_VENV:-.venv}/bin
STATE=${ENSEMBLE_SERVE_DIR:-.serve}
if [ -z "${PREFECT_API_URL:-}" ] && [ -f "$STATE/env" ]; then
  # shellcheck source=/dev/null
  . "$STATE/env"
fi
# One interpreter: the server checked, then Prefect's own command line (what the `prefect`
# executable runs) in the same process, which has imported Prefect once; a second process
# importing it again cost about a second on every deployment run (docs/deployments.md).
read -r -d '' CHECK_THEN_RUN <<'PY' || true
import sys

from prefect.settings import PREFECT_API_URL

from flows.server_check import unreachable

state, args = sys.argv[1], sys.argv[2:]
if not PREFECT_API_URL.value():
    message = (
        f"no Prefect server to run the deployment on: the stack is not running (no {state}/env) and "
        "PREFECT_API_URL is not set; fix: start it with `make serve` (or set PREFECT_API_URL to your server)"
    )
else:
    message = unreachable()
if message:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)

from prefect.cli import app

sys.argv = ["prefect", "deployment", "run", *args]
sys.exit(app())
PY
exec "$BIN/python" -c "$CHECK_THEN_RUN" "$STATE" "$@"
