"""Recovery of lost flow runs, tried again and again: how long until a run whose machine
died is marked Crashed, and whether it is always re-run and resumed from its checkpoint.

    python -m benchmarks.recovery [--tries 10] [--scenarios lost-machine,stack-restart]

Starts its own stack (:mod:`tests.prefect_stack`: server on PostgreSQL, work pool,
deployments, retry automation, reconciler with a 50 s heartbeat timeout, worker) and a
second process that keeps one CPU core busy throughout. Each try submits a run (4 MLPs of
512x512, 2,048 digits, 12 epochs of about 1 s), waits for its first checkpoint and
heartbeat, then:

- ``lost-machine``: SIGKILL of the worker's process group and of the flow-run process;
  ``scripts/serve.sh`` starts a new worker, as a supervisor would;
- ``stack-restart``: SIGKILL of everything (flow-run process, worker, reconciler, server,
  PostgreSQL); ``scripts/serve.sh`` starts the stack again on the same database.

and reads back from the server: seconds from the kill to the Crashed state, to the
re-run's start, and to completion; the execution count, and the epoch training resumed
from. Writes JSON (``--out``) and prints one line per try.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.provenance import stamp
from tests import prefect_stack

SCENARIOS = ("lost-machine", "stack-restart")
FINAL_WAIT_S = 600


def _kill(env: dict[str, str], scenario: str, run_id: str) -> float:
    """Kill as ``scenario`` says; the wall-clock time of the kill (epoch seconds)."""
    serve_dir = Path(env["ENSEMBLE_SERVE_DIR"])
    killed = time.time()
    if scenario == "lost-machine":
        (engine,) = prefect_stack.engine_pids(env, run_id)
        prefect_stack.kill_group(serve_dir / "worker.pid")
        os.kill(engine, signal.SIGKILL)
    else:
        prefect_stack.kill_stack(env)
    prefect_stack.serve(env)
    return killed


def _epoch_s(timestamp: str) -> float:
    return dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def one_try(env: dict[str, str], tmp: Path, scenario: str, i: int) -> dict:
    out = f"{scenario}-{i}"
    run_id = prefect_stack.start_long_run(env, tmp, out)
    killed = _kill(env, scenario, run_id)

    def final():
        fr = prefect_stack.api(env, "GET", f"/flow_runs/{run_id}")
        return fr if fr["state_type"] in {"COMPLETED", "FAILED", "CANCELLED"} else None

    row: dict = {"scenario": scenario, "try": i}
    try:
        fr = prefect_stack.wait_until(final, FINAL_WAIT_S, f"flow run {run_id} to end")
    except AssertionError:
        fr = prefect_stack.api(env, "GET", f"/flow_runs/{run_id}")
    states = prefect_stack.api(env, "GET", f"/flow_run_states/?flow_run_id={run_id}")
    after_kill = [s for s in states if _epoch_s(s["timestamp"]) >= killed]
    crashed = next((s for s in after_kill if s["type"] == "CRASHED"), None)
    rerun = next((s for s in after_kill if s["type"] == "RUNNING"), None)
    reports = list((tmp / out).glob("*/report.json"))
    report = json.loads(reports[0].read_text()) if reports else {}
    row.update(
        {
            "final_state": fr["state_type"],
            "run_count": fr["run_count"],
            "crashed_after_s": round(_epoch_s(crashed["timestamp"]) - killed, 1) if crashed else None,
            "marked_by": (crashed["message"] or "").rsplit("(", 1)[-1].rstrip(")") if crashed else None,
            "rerun_started_after_s": round(_epoch_s(rerun["timestamp"]) - killed, 1) if rerun else None,
            "completed_after_s": round(_epoch_s(fr["state"]["timestamp"]) - killed, 1),
            "resumed_from_epoch": report.get("resumed_from_epoch"),
        }
    )
    row["recovered"] = (
        row["final_state"] == "COMPLETED" and row["run_count"] == 2 and row["resumed_from_epoch"] is not None
    )
    return row


def _summary(rows: list[dict]) -> dict:
    crashed = [r["crashed_after_s"] for r in rows if r["crashed_after_s"] is not None]
    done = [r["completed_after_s"] for r in rows if r["recovered"]]
    quantiles = statistics.quantiles(crashed, n=10) if len(crashed) >= 2 else []
    return {
        "tries": len(rows),
        "recovered": sum(r["recovered"] for r in rows),
        "crashed_after_s": {
            "min": min(crashed, default=None),
            "median": statistics.median(crashed) if crashed else None,
            "p90": round(quantiles[-1], 1) if quantiles else None,
            "max": max(crashed, default=None),
        },
        "completed_after_s_median": statistics.median(done) if done else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recovery", description=__doc__.split("\n")[0])
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--out", default=str(prefect_stack.ROOT / "benchmarks" / "results" / "recovery-cpu-2core.json"))
    args = parser.parse_args(argv)
    scenarios = args.scenarios.split(",")
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        print(f"error: unknown scenario {unknown[0]!r}; fix: pick from {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="ensemble-recovery-"))
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rows: list[dict] = []
    try:
        with prefect_stack.stack(tmp) as env:
            for scenario in scenarios:
                for i in range(1, args.tries + 1):
                    rows.append(one_try(env, tmp, scenario, i))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        burner.kill()
    result = {
        **stamp(),
        "command": f"python -m benchmarks.recovery --tries {args.tries} --scenarios {args.scenarios}",
        "zombie_after_s": prefect_stack.ZOMBIE_AFTER_S,
        "heartbeat_s": 30,
        "load": "one core of two held busy by `python -c 'while True: pass'`",
        "summary": {s: _summary([r for r in rows if r["scenario"] == s]) for s in scenarios},
        "tries": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 0 if all(r["recovered"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
