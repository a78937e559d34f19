"""What a finished deployment run must have left on the server and on disk, read back
through the Prefect API; shared by the deployment test modules."""

import time
from pathlib import Path

from tests.prefect_stack import TASK_NAMES, api, wait_until

TASKS = TASK_NAMES
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def flow_run(env, run_id):
    return api(env, "GET", f"/flow_runs/{run_id}")


def task_runs(env, run_id):
    return api(env, "POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}})


def events(env, prefix, run_name):
    """Events named ``prefix*`` about the run directory ``run_name`` (the project's resource id)."""
    body = {"filter": {"event": {"prefix": [prefix]}, "resource": {"id": [f"ensemble-pipeline.run.{run_name}"]}}}
    return api(env, "POST", "/events/filter", body)["events"]


def wait_final(env, run_id, timeout=400, crashed_for=30.0):
    """The flow run once final. Crashed counts only after ``crashed_for`` seconds, as the
    retry-crashed-runs automation reschedules a crashed run within seconds."""
    crashed_since = []

    def final():
        fr = flow_run(env, run_id)
        if fr["state_type"] != "CRASHED":
            crashed_since.clear()
            return fr["state_type"] in TERMINAL and fr
        crashed_since[:] = crashed_since or [time.monotonic()]
        return time.monotonic() - crashed_since[0] >= crashed_for and fr

    return wait_until(final, timeout, f"flow run {run_id} to end")


def assert_complete_records(env, fr):
    """COMPLETED, each stage's task run completed, its promotion event, its report artifacts."""
    assert fr["state_type"] == "COMPLETED", (fr["name"], fr["state"])
    tasks = task_runs(env, fr["id"])
    done = {t["name"].rsplit("-", 1)[0] for t in tasks if t["state_type"] == "COMPLETED"}
    assert done >= TASKS, (fr["name"], sorted(done))
    run_dir = Path(fr["parameters"]["output_dir"]) / run_name(fr)
    name = run_dir.name
    assert (run_dir / "report.json").is_file()
    # Prefect persists events asynchronously (the flow-run process sends them over a
    # websocket, the server writes them in batches): under load the run's event can reach
    # the database seconds after its final state. Wait for it; a lost one never comes.
    found = wait_until(lambda: events(env, "ensemble.", name), 90, f"the ensemble.* event of {name}")
    assert len(found) == 1 and found[0]["event"] in {"ensemble.promoted", "ensemble.rejected"}, found
    keys = {
        a["key"]
        for a in api(env, "POST", "/artifacts/filter", {"flow_runs": {"id": {"any_": [fr["id"]]}}})
        if a.get("key")
    }
    assert {"ensemble-report", "ensemble-members", "ensemble-run-history", "training-progress"} <= keys, keys
    return run_dir


def run_name(fr) -> str:
    out = Path(fr["parameters"]["output_dir"])
    (match,) = [d.name for d in out.iterdir() if d.is_dir() and d.name.endswith("-" + fr["name"])]
    return match
