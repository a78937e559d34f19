#!/usr/bin/env bash
# Screenshot the Prefect UI with headless Chromium (Debian's `chromium` package).
#   make serve && scripts/deployment-run.sh 'train-ensemble/adhoc' --watch
#   scripts/screenshot.sh run    docs/prefect-ui-run.png     # latest completed training run
#   scripts/screenshot.sh report docs/prefect-ui-report.png  # latest ensemble-report artifact
#   scripts/screenshot.sh nightly docs/prefect-ui-nightly.png  # latest completed *scheduled* nightly run
#   scripts/screenshot.sh upcoming docs/prefect-ui-upcoming.png  # the nightly deployment's upcoming runs
#   scripts/screenshot.sh /any/ui/path out.png
set -euo pipefail
cd "$(dirname "$0")/.."
UI="http://127.0.0.1:${PREFECT_PORT:-4200}"
WHAT=${1:-run}
OUT=${2:-docs/prefect-ui-$WHAT.png}
case "$WHAT" in
  run | report | nightly | upcoming)
    PAGE=$(.venv/bin/python - "$UI/api" "$WHAT" <<'PY'
import sys, httpx
api, what = sys.argv[1], sys.argv[2]
nightly = httpx.get(api + "/deployments/name/train-ensemble/nightly").json()
if what == "upcoming":
    print(f"/deployments/deployment/{nightly['id']}?tab=Upcoming")
elif what == "nightly":
    runs = httpx.post(api + "/flow_runs/filter", json={
        "flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}},
        "deployments": {"id": {"any_": [nightly["id"]]}}, "sort": "END_TIME_DESC", "limit": 50}).json()
    print("/runs/flow-run/" + next(r["id"] for r in runs if r["auto_scheduled"]))
elif what == "report":
    art = httpx.post(api + "/artifacts/filter", json={
        "artifacts": {"key": {"any_": ["ensemble-report"]}}, "sort": "CREATED_DESC", "limit": 1}).json()
    print(f"/artifacts/artifact/{art[0]['id']}")
else:
    runs = httpx.post(api + "/flow_runs/filter", json={
        "flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}, "sort": "END_TIME_DESC", "limit": 50}).json()
    flows = {f["id"]: f["name"] for f in httpx.post(api + "/flows/filter", json={}).json()}
    print("/runs/flow-run/" + next(r["id"] for r in runs if flows.get(r["flow_id"]) == "train-ensemble"))
PY
    ) ;;
  *) PAGE=$WHAT ;;
esac
PROFILE=$(mktemp -d)
trap 'rm -rf "$PROFILE"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$PROFILE" --window-size=1600,1100 --hide-scrollbars \
  --virtual-time-budget=20000 --screenshot="$OUT" "$UI$PAGE" 2>/dev/null
echo "$OUT"
